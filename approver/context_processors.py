from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from journal.auth import roles as role_names
from journal.auth.teams import team_ids

from . import authority
from .models import ActionRequest

PLANS_COUNTED = 100  # the nav counts at most this many plans ready for sign-off (more reads "100+")


def roles(request):
    user = request.user
    return {
        "is_on_call": role_names.has_role(user, role_names.ON_CALL),
        "is_approver": role_names.has_role(user, role_names.APPROVER),
        "is_admin": role_names.has_role(user, role_names.ADMIN),
        # May read runs, plans and held calls: the nav offers them only then
        "is_reader": role_names.has_any_role(user, role_names.ON_CALL, role_names.APPROVER, role_names.ADMIN),
    }


def held_calls(request):
    """How many calls of this user's teams' agents wait for a decision by someone in this user's groups: the
    nav shows it, so an approver between meetings sees at a glance that an agent is waiting. Lazy: pages
    without the nav pay nothing."""
    def count() -> int:
        user = request.user
        if not user.is_authenticated:
            return 0
        groups = [name for name in role_names.ALL if role_names.has_role(user, name)]
        return ActionRequest.objects.filter(
            state=ActionRequest.State.PENDING, approver_group__in=groups, expires_at__gt=timezone.now(),
            agent__team_id__in=team_ids(user)).count() if groups else 0

    return {"held_waiting": SimpleLazyObject(count)}


def plans_waiting(request):
    """How many plans ready for sign-off this user may sign and has not: the nav shows it beside Plans, so an
    approver sees at a glance what waits for them. Lazy, as `held_calls`."""
    def count() -> str:
        mine, more = authority.waiting_for(request.user, limit=PLANS_COUNTED)
        if more and len(mine) == PLANS_COUNTED:
            return f"{len(mine)}+"
        return str(len(mine)) if mine else ""

    return {"plans_waiting": SimpleLazyObject(count)}
