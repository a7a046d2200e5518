"""Access helpers for views: each returns what the view may show or raises 403 (or 404) inside."""

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404

from ..models import Agent
from . import roles, teams

READERS = (roles.ON_CALL, roles.APPROVER, roles.ADMIN)


def visible_agents(user):
    """Readers (on-call, approvers) see their teams' agents, admins every agent; anyone else the agents
    acting for them."""
    agents = Agent.objects.select_related("on_behalf_of", "team").order_by("name")
    return teams.team_agents(user, agents) if roles.has_any_role(user, *READERS) else agents.filter(
        on_behalf_of=user)


def visible_agent(request, name: str) -> Agent:
    """The agent named `name`, if the signed-in person may see it. One that acts for someone else is "no
    such agent", word for word as one that does not exist: which agent names exist is not theirs to learn."""
    if not request.user.is_authenticated:
        raise LoginRequired(request)
    agent = visible_agents(request.user).filter(name=name).first()
    if agent is None:
        raise Http404("No such agent among those you may see.")
    return agent


def require_role(request, *allowed: str) -> None:
    """Anonymous users go to the login page; signed-in users without one of `allowed` get a 403."""
    if not request.user.is_authenticated:
        raise LoginRequired(request)
    if not roles.has_any_role(request.user, *allowed):
        raise PermissionDenied(
            "Your account has none of the roles this page needs: " + ", ".join(allowed) + "."
        )


def visible_run(request, public_id, runs=None):
    """The run `public_id`, if the signed-in person's teams reach it: another team's run is "no such run",
    as one that does not exist (which runs exist elsewhere is not theirs to learn)."""
    run = teams.visible_runs(request.user, runs).filter(public_id=public_id).first()
    if run is None:
        raise Http404("No such run among those you may see.")
    return run


class LoginRequired(Exception):
    def __init__(self, request):
        self.response = redirect_to_login(request.get_full_path())


class LoginRequiredMiddleware:
    """Turns `LoginRequired` raised by an access helper into the login redirect."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, LoginRequired):
            return exception.response
        return None
