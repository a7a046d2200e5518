"""Access helpers for views: each returns what the view may show or raises 403 inside."""

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied

from . import roles

READERS = (roles.ON_CALL, roles.APPROVER, roles.ADMIN)


def require_role(request, *allowed: str) -> None:
    """Anonymous users go to the login page; signed-in users without one of `allowed` get a 403."""
    if not request.user.is_authenticated:
        raise LoginRequired(request)
    if not roles.has_any_role(request.user, *allowed):
        raise PermissionDenied(
            "Your account has none of the roles this page needs: " + ", ".join(allowed) + "."
        )


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
