"""People's API tokens: made (shown once, only a hash kept), revoked, and read back from a request's
`Authorization: Bearer` header."""

import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from journal.auth import roles
from journal.services import hash_token  # the agents' tokens are kept the same way

from ..models import PersonalToken

TOKEN_PREFIX = "uat_"
TOUCH_SECONDS = 60  # when a token was last used, to within a minute: not a write on every request


class TokenRefused(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def api_token_max_days() -> int:
    return settings.API_TOKEN_MAX_DAYS


def make_token(*, user, name: str, days: int, scope: str = PersonalToken.Scope.READ,
               now: datetime | None = None) -> tuple[PersonalToken, str]:
    """A token of `user`'s own, valid `days` days (at most API_TOKEN_MAX_DAYS): the row, and the token,
    which is shown once and never stored. Only people with a role make one: it does what they may."""
    now = now or timezone.now()
    if not roles.has_any_role(user, *roles.ALL):
        raise TokenRefused("Your account has no role, so a token of yours could do nothing.")
    name = (name or "").strip()
    if not name:
        raise TokenRefused("Say what the token is for: its name tells it apart from your others.")
    if len(name) > 100:
        raise TokenRefused("Keep the name under 100 characters.")
    if scope not in PersonalToken.Scope.values:
        raise TokenRefused("Choose what the token may do: read, or read and undo.")
    if not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        raise TokenRefused(f"A token lasts from 1 to {settings.API_TOKEN_MAX_DAYS} days.")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = PersonalToken.objects.create(user=user, name=name, token_hash=hash_token(token), prefix=token[:10],
                                       scope=scope, created_at=now, expires_at=now + timedelta(days=days))
    return row, token


def revoke_token(*, token: PersonalToken, now: datetime | None = None) -> bool:
    """Revoke it at once; False if it was revoked already."""
    return bool(PersonalToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()))


def token_of(header: str, *, now: datetime | None = None) -> PersonalToken | None:
    """The live token an `Authorization` header's bearer token is, with its active person, or None: one that
    is unknown, revoked or expired, or whose person was deactivated, opens nothing."""
    scheme, _, token = (header or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
        return None
    now = now or timezone.now()
    row = (PersonalToken.objects.live(now).select_related("user")
           .filter(token_hash=hash_token(token), user__is_active=True).first())
    touch = row is not None and (row.last_used_at is None
                                 or now - row.last_used_at > timedelta(seconds=TOUCH_SECONDS))
    if touch:
        PersonalToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row
