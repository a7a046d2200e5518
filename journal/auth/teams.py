"""Which teams a person's roles reach: a person sees, plans and signs only for their teams' agents; admins
for every team's. Read again on every request (a per-request cache on the user object), so a person taken
out of a team, by an admin or by the identity provider's groups (`journal.auth.oidc`), loses it at once."""

from django.db.models import Q, QuerySet

from ..models import Agent, Run, Team
from . import roles


def sees_every_team(user) -> bool:
    return roles.has_role(user, roles.ADMIN)


def team_ids(user) -> frozenset[int]:
    """The teams `user` belongs to: those listing them, and those counting everyone with a role (for someone
    with one). Admins belong to none by this: `sees_every_team` is what opens every team to them."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    cached = getattr(user, "_team_ids", None)
    if cached is None:
        everyone = Q(everyone=True) if roles.has_any_role(user, *roles.ALL) else Q(pk__in=[])
        cached = frozenset(Team.objects.filter(Q(members=user) | everyone).values_list("pk", flat=True))
        user._team_ids = cached
    return cached


def in_team(user, team_id: int | None) -> bool:
    """Whether `user` may see and act for the team `team_id` (admins: every team)."""
    return sees_every_team(user) or team_id in team_ids(user)


def in_every_team(user, ids) -> bool:
    """Whether `user` may act for every one of the teams `ids` (a plan since a moment may span several)."""
    return sees_every_team(user) or set(ids) <= team_ids(user)


def visible_runs(user, runs: QuerySet | None = None) -> QuerySet:
    """`runs` (default: every run) narrowed to the teams `user` may see."""
    runs = Run.objects.all() if runs is None else runs
    return runs if sees_every_team(user) else runs.filter(team_id__in=team_ids(user))


def team_agents(user, agents: QuerySet | None = None) -> QuerySet:
    """`agents` (default: every agent) narrowed to the teams `user` may see."""
    agents = Agent.objects.all() if agents is None else agents
    return agents if sees_every_team(user) else agents.filter(team_id__in=team_ids(user))


def visible_teams(user) -> QuerySet:
    teams = Team.objects.all()
    return teams if sees_every_team(user) else teams.filter(pk__in=team_ids(user))


def forget(user) -> None:
    """Drop the per-request cache (after the user's teams or roles changed within the request)."""
    for name in ("_team_ids", "_role_names"):
        if hasattr(user, name):
            delattr(user, name)
