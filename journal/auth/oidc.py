"""Sign-in through the company's identity provider (OpenID Connect), on mozilla-django-oidc: the provider's
endpoints found from its issuer URL (discovery), the code flow with PKCE and a nonce, accounts made at the
first sign-in, and the provider's groups turned into this product's roles and teams (`OIDC_GROUPS`) at every
sign-in and again while the person works (`ProviderGroups`), so a person taken out of a group loses what it
gave at their next request. Passkeys stay what approvers sign with, whatever they signed in with."""

import logging
import re
import time
from typing import Any

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from ..models import ProviderIdentity, Team
from . import roles, teams

logger = logging.getLogger(__name__)

DISCOVERY_SECONDS = 3600  # the provider's discovery document is read again after this long
# Where mozilla-django-oidc reads each endpoint, and the discovery document's name for it.
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
TEAM_PREFIX = "team:"
CHECKED_AT = "oidc_checked_at"  # session key: when the provider last vouched for this person's groups
REFRESH_TOKEN = "oidc_refresh_token"


class ProviderUnavailable(Exception):
    """The identity provider did not answer, or answered what is not OpenID Connect."""


def enabled() -> bool:
    return bool(settings.OIDC_ISSUER)


def discovered() -> dict[str, Any]:
    """The provider's discovery document (`{issuer}/.well-known/openid-configuration`), kept an hour. Its
    `issuer` must be the one configured, exactly, as OpenID Connect Discovery requires."""
    document = cache.get("oidc-discovery")
    if document is not None and document.get("issuer") == settings.OIDC_ISSUER:
        return document
    url = f"{settings.OIDC_ISSUER}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"{settings.OIDC_PROVIDER_NAME} did not answer at {url}: {exc}") from None
    if not isinstance(document, dict) or document.get("issuer") != settings.OIDC_ISSUER:
        raise ProviderUnavailable(f"{url} names another issuer ({document.get('issuer')!r} is not "
                                  f"{settings.OIDC_ISSUER!r}), so nothing it signs is trusted.")
    missing = [name for name in ENDPOINTS.values() if not document.get(name)]
    if missing:
        raise ProviderUnavailable(f"{url} does not say its {', '.join(missing)}.")
    cache.set("oidc-discovery", document, DISCOVERY_SECONDS)
    return document


def oidc_setting(attr: str, *args):
    """A mozilla-django-oidc setting, with the endpoints taken from discovery."""
    if attr in ENDPOINTS and enabled():
        return discovered()[ENDPOINTS[attr]]
    return import_from_settings(attr, *args)


# -- what the provider's groups give ------------------------------------------------------------------------


def granted(claims: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The roles and the team names the person's groups give (`OIDC_GROUPS`: a provider group to a list of
    roles and `team:NAME`s). A groups claim that is not a list of names gives nothing."""
    groups = claims.get(settings.OIDC_GROUPS_CLAIM)
    if not isinstance(groups, list):
        groups = []
    given = [item for group in groups if isinstance(group, str)
             for item in settings.OIDC_GROUPS.get(group, ())]
    return ({item for item in given if item in roles.ALL},
            {item[len(TEAM_PREFIX):] for item in given if item.startswith(TEAM_PREFIX)})


def managed_teams() -> set[str]:
    """The teams whose members the provider decides: those `OIDC_GROUPS` names."""
    return {item[len(TEAM_PREFIX):] for items in settings.OIDC_GROUPS.values() for item in items
            if item.startswith(TEAM_PREFIX)}


def apply_groups(user, claims: dict[str, Any]) -> None:
    """Make the person's roles exactly those their groups give, and their membership of each team the
    provider decides exactly what their groups say (teams an admin keeps by hand are left as they are).
    With no `OIDC_GROUPS` at all, roles and teams are the admins' to give, and nothing is changed."""
    if not settings.OIDC_GROUPS:
        return
    wanted_roles, wanted_teams = granted(claims)
    managed = sorted(managed_teams())
    has_roles = set(user.groups.filter(name__in=roles.ALL).values_list("name", flat=True))
    in_teams = set(Team.objects.filter(name__in=managed, members=user).values_list("name", flat=True))
    if has_roles == set(wanted_roles) & set(roles.ALL) and in_teams == set(wanted_teams) & set(managed):
        return  # asked again while they work, and nothing changed: nothing is written
    with transaction.atomic():
        for role in roles.ALL:
            group = Group.objects.get_or_create(name=role)[0]
            if role in wanted_roles:
                user.groups.add(group)
            else:
                user.groups.remove(group)
        for name in managed:
            team = Team.objects.get_or_create(name=name, defaults={"title": name})[0]
            if name in wanted_teams:
                team.members.add(user)
            else:
                team.members.remove(user)
    teams.forget(user)


def _username(claims: dict[str, Any]) -> str:
    """A free username from the claims: their preferred name (else their email's local part, else `sub`),
    in the characters Django takes, made unique with a number where someone has it already."""
    wanted = str(claims.get("preferred_username") or str(claims.get("email") or "").split("@")[0]
                 or claims.get("sub") or "person")
    base = re.sub(r"[^\w.@+-]", "-", wanted)[:140] or "person"
    name, n = base, 1
    while auth.get_user_model().objects.filter(username=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


class CompanySignIn(OIDCAuthenticationBackend):
    """The authentication backend: a person is found by the provider's subject (`sub`), never by email (an
    address may be given to someone else); made at their first sign-in; their roles and teams set from
    their groups every time."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args, **kwargs):
        # Not the library's: it reads the endpoints (discovery) at once, and Django makes a backend to read
        # every signed-in request's user, which must not wait on the provider.
        self.UserModel = auth.get_user_model()
        self._refresh_token = None

    def authenticate(self, request, **kwargs):
        if not enabled() or request is None or "code" not in request.GET:
            return None
        try:
            OIDCAuthenticationBackend.__init__(self)  # the endpoints, from discovery
            return super().authenticate(request, **kwargs)
        except (ProviderUnavailable, requests.RequestException) as exc:
            logger.warning("sign-in through %s failed: %s", settings.OIDC_PROVIDER_NAME, exc)
            request.oidc_problem = str(exc)
            return None

    def get_token(self, payload):
        token_info = super().get_token(payload)
        self._refresh_token = token_info.get("refresh_token")
        return token_info

    def store_tokens(self, access_token, id_token):
        super().store_tokens(access_token, id_token)
        self.request.session[REFRESH_TOKEN] = self._refresh_token
        self.request.session[CHECKED_AT] = time.time()

    def verify_claims(self, claims):
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(
            provider_identity__issuer=settings.OIDC_ISSUER, provider_identity__subject=str(claims["sub"]))

    def create_user(self, claims):
        with transaction.atomic():
            user = self.UserModel.objects.create_user(
                username=_username(claims), email=str(claims.get("email") or "")[:254])
            user.set_unusable_password()  # they sign in through the provider, never with a password here
            user.save()
            ProviderIdentity.objects.create(user=user, issuer=settings.OIDC_ISSUER,
                                            subject=str(claims["sub"]))
        apply_groups(user, claims)
        return user

    def update_user(self, user, claims):
        email = str(claims.get("email") or "")[:254]
        if email and email != user.email:
            user.email = email
            user.save(update_fields=["email"])
        apply_groups(user, claims)
        return user


class SignInStart(OIDCAuthenticationRequestView):
    """/oidc/authenticate/: off to the provider, endpoints from discovery; a provider that does not answer is
    said on the login page, not a 500."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args, **kwargs):
        self.init_args = (args, kwargs)

    def get(self, request):
        if not enabled():
            return redirect("login")
        try:
            super().__init__(*self.init_args[0], **self.init_args[1])
            return super().get(request)
        except ProviderUnavailable as exc:
            messages.error(request, f"Signing in through {settings.OIDC_PROVIDER_NAME} is not possible now: "
                                    f"{exc}")
            return redirect("login")


class SignInReturn(OIDCAuthenticationCallbackView):
    """/oidc/callback/: a sign-in that did not work says why on the login page."""

    def get(self, request):
        try:
            return super().get(request)
        except SuspiciousOperation:
            messages.error(request, "That sign-in link was used already or came from elsewhere: sign in "
                                    "again.")
            return redirect("login")

    def login_failure(self):
        problem = getattr(self.request, "oidc_problem", "") or self.request.GET.get("error_description") or (
            self.request.GET.get("error") or "the provider did not vouch for you")
        messages.error(self.request,
                       f"Signing in through {settings.OIDC_PROVIDER_NAME} did not work: {problem}")
        return HttpResponseRedirect(reverse("login"))


# -- the provider's word, again, while the person works ------------------------------------------------------


class ProviderGroups:
    """For a person signed in through the provider: before any write (every POST), and before a read once
    `OIDC_RECHECK_SECONDS` have passed since the provider last vouched, ask its userinfo endpoint again
    with the person's access token (refreshed with their refresh token when it has lapsed) and set their
    roles and teams from the answer. A provider that no longer vouches for them (the token refused, the
    refresh refused) ends the session. One that does not answer: reads go on with what it last said,
    writes are refused until it answers."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        answer = self._check(request) if enabled() else None
        return answer or self.get_response(request)

    def _check(self, request) -> HttpResponse | None:
        session = getattr(request, "session", None)
        if session is None or "oidc_access_token" not in session or not request.user.is_authenticated:
            return None
        writes = request.method not in ("GET", "HEAD", "OPTIONS")
        if not writes and time.time() - session.get(CHECKED_AT, 0) < settings.OIDC_RECHECK_SECONDS:
            return None
        try:
            claims = self._userinfo(session)
        except ProviderUnavailable as exc:
            if not writes:
                return None
            return _refused(request, 503, f"{settings.OIDC_PROVIDER_NAME} did not answer, so your groups "
                                          f"cannot be confirmed; try again in a moment ({exc}).")
        if claims is None or str(claims.get("sub")) != _subject_of(request.user):
            auth.logout(request)
            return _refused(request, 401, f"{settings.OIDC_PROVIDER_NAME} no longer vouches for your "
                                          "sign-in: sign in again.")
        apply_groups(request.user, claims)
        session[CHECKED_AT] = time.time()
        return None

    def _userinfo(self, session) -> dict[str, Any] | None:
        """The provider's claims for the session's person; None when it refuses the token and the refresh."""
        document = discovered()
        for attempt in range(2):
            try:
                response = requests.get(document["userinfo_endpoint"], timeout=settings.OIDC_TIMEOUT,
                                        headers={"Authorization": f"Bearer {session['oidc_access_token']}"})
            except requests.RequestException as exc:
                raise ProviderUnavailable(str(exc)) from None
            if response.status_code == 200:
                try:
                    claims = response.json()
                except ValueError:
                    raise ProviderUnavailable("its userinfo answer is not JSON") from None
                return claims if isinstance(claims, dict) else None
            if response.status_code >= 500:
                raise ProviderUnavailable(f"its userinfo endpoint answered {response.status_code}")
            if attempt or not self._refresh(session, document):
                return None
        return None

    def _refresh(self, session, document) -> bool:
        token = session.get(REFRESH_TOKEN)
        if not token:
            return False
        try:
            response = requests.post(document["token_endpoint"], timeout=settings.OIDC_TIMEOUT, data={
                "grant_type": "refresh_token", "refresh_token": token,
                "client_id": settings.OIDC_RP_CLIENT_ID, "client_secret": settings.OIDC_RP_CLIENT_SECRET})
        except requests.RequestException as exc:
            raise ProviderUnavailable(str(exc)) from None
        if response.status_code != 200:
            return False
        answer = response.json()
        session["oidc_access_token"] = answer.get("access_token")
        session[REFRESH_TOKEN] = answer.get("refresh_token") or token
        return bool(session["oidc_access_token"])


def _subject_of(user) -> str:
    identity = ProviderIdentity.objects.filter(user=user, issuer=settings.OIDC_ISSUER).first()
    return identity.subject if identity else ""


def _refused(request, status: int, message: str) -> HttpResponse:
    """A refused request: JSON for the API and for scripts; else the message on the login page (signed out)
    or on a plain page saying so (the provider down: nothing was done)."""
    if request.path.startswith("/api/") or request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"error": message}, status=status)
    if status == 401:
        messages.error(request, message)
        return redirect(f"{reverse('login')}?next={request.get_full_path()}")
    return HttpResponse(f"Nothing was done. {message}", status=status,
                        content_type="text/plain; charset=utf-8")
