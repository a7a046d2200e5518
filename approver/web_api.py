"""The one JSON API at /api/: runs and steps (`journal.api`) and reversal plans (`approver.api`), with its
OpenAPI document generated from their functions and schemas by django-ninja at /api/openapi.json.

Who calls it: a person's browser session (a write needs its CSRF token, as a form does), or a script with
a personal API token (`Authorization: Bearer uat_…`, made on the API tokens page), which acts with its
person's roles and teams as they are at each request, within its scope. Errors are JSON: `{"error": "…"}`.
"""

from functools import wraps
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer, django_auth

from journal import api as journal_api
from journal.auth import roles
from journal.auth.access import READERS, LoginRequired

from . import api as plans_api
from .services import token_of

TOKEN_HINT = ("Sign in, or send a personal API token as `Authorization: Bearer uat_…` (make one on the API "
              "tokens page).")


class PersonalTokenAuth(HttpBearer):
    """A personal API token: its person becomes the request's user, so every access rule reads them as the
    pages do. An unknown, revoked or expired token, or one whose person was deactivated, opens nothing."""

    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> Any:
        return self.authenticate(request, "") if request.headers.get("Authorization") else None

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        row = token_of(request.headers.get("Authorization", ""))
        if row is None:
            raise AuthenticationError(401, UNKNOWN_TOKEN)
        request.user = row.user
        return row


UNKNOWN_TOKEN = "This API token is unknown, revoked or expired."


def _readers_only(view):
    """The OpenAPI document, for whoever may read runs (by session or token), as the API itself is."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.headers.get("Authorization"):
            try:
                PersonalTokenAuth()(request)  # the API's own sign-in, as every call has it
            except AuthenticationError:
                return JsonResponse({"error": UNKNOWN_TOKEN}, status=401)
        if not request.user.is_authenticated:
            return JsonResponse({"error": TOKEN_HINT}, status=401)
        if not roles.has_any_role(request.user, *READERS):
            return JsonResponse({"error": "Your account has none of the roles the API needs."}, status=403)
        return view(request, *args, **kwargs)

    return wrapped


api = NinjaAPI(
    title="Agent undo",
    version="1",
    description=__doc__,
    urls_namespace="api",
    docs_url=None,  # an HTML viewer would load scripts from elsewhere, which the site's CSP refuses
    docs_decorator=_readers_only,
    auth=[PersonalTokenAuth(), django_auth],
)
api.add_router("", journal_api.router)
api.add_router("", plans_api.router)


def _error(request: HttpRequest, message: str, status: int, **headers: str) -> HttpResponse:
    response = api.create_response(request, {"error": message}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc: AuthenticationError):
    message = TOKEN_HINT if exc.message == "Unauthorized" else exc.message
    return _error(request, message, 401, **{"WWW-Authenticate": 'Bearer realm="agent-undo"'})


@api.exception_handler(LoginRequired)
def _login_required(request, exc: LoginRequired):
    return _error(request, TOKEN_HINT, 401, **{"WWW-Authenticate": 'Bearer realm="agent-undo"'})


@api.exception_handler(PermissionDenied)
def _forbidden(request, exc: PermissionDenied):
    return _error(request, str(exc) or "You may not do this.", 403)


@api.exception_handler(Http404)
def _not_found(request, exc: Http404):
    return _error(request, str(exc) or "No such thing among those you may see.", 404)


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    return _error(request, str(exc), exc.status_code)


@api.exception_handler(ValidationError)
def _invalid(request, exc: ValidationError):
    problems = "; ".join(
        f"{'.'.join(str(p) for p in error.get('loc', ())[1:]) or 'body'}: {error.get('msg', '')}"
        for error in exc.errors)
    return api.create_response(request, {"error": f"The request is not what this call takes: {problems}",
                                          "problems": exc.errors}, status=422)
