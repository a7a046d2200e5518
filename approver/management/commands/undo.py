from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from approver import services
from approver.content import site_url
from journal import zones
from journal.auth import roles, teams
from journal.management.commands._runs import find_run
from journal.models import Agent


class Command(BaseCommand):
    help = ("Build a reversal plan, and queue its checks: for a run, from step N onwards; or for everything "
            "an agent did since a moment, across its runs. Prints the plan's id, summary and URL.")

    def add_arguments(self, parser):
        parser.add_argument("run", nargs="?", help="The run's id (UUID).")
        parser.add_argument("--from-step", type=int, help="Undo this step and everything after it.")
        parser.add_argument("--agent", help="Undo everything this agent did since --since, in every run.")
        parser.add_argument("--since", help="The moment, ISO 8601 (in --zone if it names no offset).")
        parser.add_argument("--zone", help="The time zone --since is read and the plan is named in, an IANA "
                                           "name such as Europe/Berlin (default: the server's).")
        parser.add_argument("--reason", default="", help="Why (shown to the approver).")
        parser.add_argument("--as", dest="username", required=True,
                            help="The on-call user asking (the plan records who asked).")

    def handle(self, *args, zone=None, **options):
        with zones.in_zone(zone):
            self._undo(**options)

    def _undo(self, *, run, from_step, agent, since, reason, username, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None or not roles.has_role(user, roles.ON_CALL):
            raise CommandError(
                f"{username!r} is not an active on-call user; only on-call staff ask for undo."
            )
        if (run is None) == (agent is None) or (run and from_step is None) or (agent and not since):
            raise CommandError("Say a run and --from-step N, or --agent NAME and --since MOMENT.")
        chosen = _agent(agent) if agent else find_run(run)
        if not teams.in_team(user, chosen.team_id):
            raise CommandError(f"{username!r} is not in the team {chosen.team}, whose "
                               f"{'agent' if agent else 'run'} this is: only its team asks to undo it.")
        try:
            if agent:
                plan = services.request_plan_since(agent=chosen, since=_moment(since),
                                                   requested_by=user, reason=reason)
            else:
                plan = services.request_plan(run=chosen, requested_by=user, reason=reason,
                                             from_step=from_step)
        except services.PlanRefused as refused:
            where = (
                f" Open plan: {site_url()}{services.plan_url(refused.open_plan)}"
                if refused.open_plan
                else ""
            )
            raise CommandError(refused.message + where) from None
        self.stdout.write(f"Plan {plan.public_id}")
        self.stdout.write(f"Undo {plan.compensate_count} action{'s' if plan.compensate_count != 1 else ''} "
                          f"{plan.selection_text}; {plan.cannot_undo_count} cannot be undone. Checks queued.")
        self.stdout.write(f"{site_url()}{services.plan_url(plan)}")


def _agent(name: str) -> Agent:
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        raise CommandError(f"No agent is named {name!r}.")
    return agent


def _moment(text: str):
    try:
        moment = parse_datetime(text.strip())
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"{text!r} is not a moment: give it as ISO 8601, like 2026-12-02T03:10:00Z.")
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)
