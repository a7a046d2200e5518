"""Agents and their bearer tokens: created once (the token is shown once and never stored), reset, checked."""

import hashlib
import secrets

from django.db import transaction

from ..models import Agent, Run, Team

TOKEN_PREFIX = "agt_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_agent(*, name: str, on_behalf_of, advice_in_content: bool = False,
                 runs_by: str = Agent.RunsBy.SESSION, team: Team | None = None) -> tuple[Agent, str]:
    """Create an agent and return it with its bearer token, which is shown once and never stored. It joins
    `team`, else its person's one team if they are listed in exactly one, else the default team."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    agent = Agent.objects.create(
        name=name, on_behalf_of=on_behalf_of, token_hash=hash_token(token), token_prefix=token[:10],
        advice_in_content=advice_in_content, runs_by=runs_by, team=team or team_for(on_behalf_of))
    return agent, token


def team_for(person) -> Team:
    """The team a new agent acting for `person` joins when nobody chose one."""
    listed = list(Team.objects.filter(members=person)[:2]) if person is not None else []
    return listed[0] if len(listed) == 1 else Team.objects.default()


def move_agent(*, agent: Agent, team: Team) -> int:
    """Give `agent` to `team`, with every run it made (who may see and undo them goes with the agent); returns
    how many runs moved."""
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(team=team)
        agent.team = team
        return Run.objects.filter(agent=agent).update(team=team)


def authenticate_agent(token: str) -> Agent | None:
    if not token.startswith(TOKEN_PREFIX):
        return None
    return (
        Agent.objects.select_related("on_behalf_of")
        .filter(token_hash=hash_token(token), is_active=True, on_behalf_of__is_active=True)
        .first()
    )



def reset_agent_token(*, agent: Agent) -> str:
    """Give an agent a new token; the old one stops working at once."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    agent.token_hash, agent.token_prefix = hash_token(token), token[:10]
    agent.save(update_fields=["token_hash", "token_prefix"])
    return token
