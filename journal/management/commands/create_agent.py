from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from journal import services
from journal.models import Team


class Command(BaseCommand):
    help = "Create an agent acting for a user and print its bearer token (shown once; only a hash is kept)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--on-behalf-of", required=True, metavar="USERNAME")
        parser.add_argument("--advice-in-content", action="store_true",
                            help="Add the advice on a failed call to its content as text too, for frameworks "
                                 "that drop _meta (LangChain, pydantic-ai).")

        parser.add_argument("--team", default="", help="The team it belongs to (default: its person's one "
                                                         "team, else DEFAULT_TEAM).")
        parser.add_argument("--runs-by", choices=["session", "idle", "run_id"], default="session",
                            help="How its calls form runs: per MCP session (the default), or by the idle gap "
                                 "across sessions (for frameworks that open a session per tool call: "
                                 "langchain-mcp-adapters, LlamaIndex), its runId winning in both; or by its "
                                 "runId only (a call without one is a run of its own).")

    def handle(self, name, on_behalf_of, advice_in_content=False, runs_by="session", team="", **options):
        user = get_user_model().objects.filter(username=on_behalf_of).first()
        if user is None:
            raise CommandError(f"No user {on_behalf_of!r}.")
        chosen = Team.objects.filter(name=team).first() if team else None
        if team and chosen is None:
            raise CommandError(f"No team is named {team!r}.")
        try:
            agent, token = services.create_agent(name=name, on_behalf_of=user, team=chosen,
                                                 advice_in_content=advice_in_content, runs_by=runs_by)
        except IntegrityError:
            raise CommandError(f"An agent named {name!r} exists already.") from None
        self.stdout.write(f"Agent {agent.name} acts for {user.get_username()}, in team {agent.team.name}. "
                          "Its token (shown once):")
        self.stdout.write(token)
