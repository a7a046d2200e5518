"""OAuth clients acting as agents: a person authorises a client that takes only a URL to act as one of their
agents (`journal.auth.oauth` is the consent page), the Recorder accepts that client's tokens as the agent's,
and the agent's page revokes them.

A token is the agent's while all of this holds: it has not expired, it carries the `mcp` scope, its audience
(RFC 8707 `resource`) is this Recorder's URL, the person who authorised it and the agent are active, and the
authorization has not been revoked. Each is checked on every request (no cache), so revoking takes effect at
once in every Recorder process.
"""

import hashlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from oauth2_provider.models import (
    get_access_token_model,
    get_application_model,
    get_grant_model,
    get_refresh_token_model,
)

from ..models import Agent, ClientAuthorization, RedeemedCode

logger = logging.getLogger(__name__)

SCOPE = "mcp"
LAST_USED_EVERY = timedelta(minutes=1)


def canonical_resource(uri: str) -> str:
    """An RFC 8707 resource as the Recorder compares it: lower-case scheme and host, no fragment, query or
    trailing slash (so `…/mcp` and `…/mcp/` name the same Recorder)."""
    parts = urlsplit(uri.strip())
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), "", ""))


def recorder_url(scheme: str, host: str) -> str:
    """This Recorder's URL, the audience of its tokens: RECORDER_URL, or the URL a request came to."""
    configured = settings.RECORDER_URL
    return canonical_resource(configured or f"{scheme}://{host}/mcp")


def resource_metadata_url(resource: str) -> str:
    """Where RFC 9728 metadata for `resource` is (the path-suffixed well-known URL)."""
    parts = urlsplit(resource)
    return urlunsplit(
        (parts.scheme, parts.netloc, "/.well-known/oauth-protected-resource" + parts.path, "", "")
    )


@dataclass(frozen=True)
class TokenVerdict:
    agent: Agent | None
    problem: str = ""  # why the token is refused, for `error_description`


def agent_for_token(token: str, *, audience: str) -> TokenVerdict:
    """The agent an OAuth access token acts as at the Recorder whose URL is `audience`, or why not."""
    checksum = hashlib.sha256(token.encode("utf-8")).hexdigest()
    access = get_access_token_model().objects.select_related("user").filter(token_checksum=checksum).first()
    if access is None:
        return TokenVerdict(None, "The token is not known here (revoked, replaced or never issued).")
    if access.is_expired():
        return TokenVerdict(None, "The token has expired; refresh it.")
    if not access.allow_scopes([SCOPE]):
        return TokenVerdict(None, f"The token lacks the '{SCOPE}' scope.")
    if canonical_resource(audience) not in {
        canonical_resource(r) for r in access.resource or [] if isinstance(r, str)
    }:
        return TokenVerdict(None, f"The token was issued for another resource, not {audience}.")
    if access.user is None or not access.user.is_active:
        return TokenVerdict(None, "The person who authorised this client is no longer active.")
    authorization = (
        ClientAuthorization.objects.select_related("agent__on_behalf_of")
        .filter(application_id=access.application_id, user_id=access.user_id)
        .first()
    )
    if authorization is None:
        return TokenVerdict(None, "This client's authorization was revoked.")
    agent = authorization.agent
    if not agent.is_active or not agent.on_behalf_of.is_active:
        return TokenVerdict(None, f"Agent {agent.name} is deactivated.")
    now = timezone.now()
    if authorization.last_used_at is None or now - authorization.last_used_at > LAST_USED_EVERY:
        ClientAuthorization.objects.filter(pk=authorization.pk).update(last_used_at=now)
    return TokenVerdict(agent)


def agents_for(user) -> list[Agent]:
    """The agents a person may let a client act as: the active ones acting for them."""
    return list(Agent.objects.filter(on_behalf_of=user, is_active=True).order_by("name"))


class ClientRefused(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@transaction.atomic
def authorize_client(*, application, user, agent: Agent) -> ClientAuthorization:
    """Let `application` act as `agent` for `user`. If it acted as another agent for them before, the tokens
    it holds for that one end now: a token is one agent's, for its whole life."""
    if agent.on_behalf_of_id != user.pk or not agent.is_active:
        raise ClientRefused(f"Agent {agent.name} does not act for {user.get_username()}.")
    existing = (
        ClientAuthorization.objects.select_for_update().filter(application=application, user=user).first()
    )
    if existing is not None and existing.agent_id != agent.pk:
        _end_tokens(application=application, user=user)
    if existing is None:
        return ClientAuthorization.objects.create(application=application, user=user, agent=agent)
    existing.agent = agent
    existing.created_at = timezone.now()
    existing.save(update_fields=["agent", "created_at"])
    return existing


@transaction.atomic
def revoke_client(*, authorization: ClientAuthorization) -> None:
    """End the authorization and every token and code the client holds for that person, at once."""
    _end_tokens(application=authorization.application, user=authorization.user)
    authorization.delete()


def _end_tokens(*, application, user) -> None:
    for refresh in get_refresh_token_model().objects.filter(
        application=application, user=user, revoked__isnull=True
    ):
        refresh.revoke()
    get_access_token_model().objects.filter(application=application, user=user).delete()
    get_grant_model().objects.filter(application=application, user=user).delete()


def forget_unused_clients(*, older_than) -> int:
    """Remove dynamically registered clients nobody authorised within a day of registering (open registration
    is how MCP clients arrive, and a registration that never led anywhere is litter)."""
    Application = get_application_model()
    unused = Application.objects.filter(
        registration_source=Application.RegistrationSource.DCR, created__lt=older_than
    ).exclude(pk__in=ClientAuthorization.objects.values("application_id"))
    return unused.delete()[1].get(Application._meta.label, 0)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def code_redeemed(*, code: str, application, access_token: str) -> None:
    """An authorization code was exchanged for `access_token` (and its refresh token): remember what it
    gave, by digests only, so a replay can end it (`code_replayed`)."""
    checksum = _digest(access_token)
    refresh = get_refresh_token_model().objects.filter(access_token__token_checksum=checksum).first()
    RedeemedCode.objects.get_or_create(code_digest=_digest(code), defaults={
        "application": application, "access_token_checksum": checksum,
        "token_family": refresh.token_family if refresh is not None else None})


def code_replayed(*, code: str, application) -> bool:
    """Someone presented a code that was already exchanged: it leaked, so every token it gave ends now, the
    refresh tokens rotated from it included (RFC 6749 section 4.1.2, RFC 9700 section 4.5). Whether it was
    such a code (an unknown or expired one is not)."""
    redeemed = RedeemedCode.objects.filter(code_digest=_digest(code), application=application).first()
    if redeemed is None:
        return False
    with transaction.atomic():
        get_refresh_token_model().revoke_family(redeemed.token_family)
        get_access_token_model().objects.filter(token_checksum=redeemed.access_token_checksum).delete()
    logger.warning("An authorization code of client %s was presented again: its tokens are ended.",
                   application.client_id)
    return True


def forget_redeemed_codes(*, older_than) -> int:
    """Forget codes whose tokens could no longer be alive anyway."""
    return RedeemedCode.objects.filter(redeemed_at__lt=older_than).delete()[0]


def forget_pending_beyond(keep: int) -> int:
    """Keep at most `keep` dynamically registered clients nobody has authorised: forget the oldest beyond
    that (a registration flood cannot grow the table, and the newest registration, an honest client's that
    is signing in now, is always kept). Returns how many were forgotten."""
    Application = get_application_model()
    pending = Application.objects.filter(registration_source=Application.RegistrationSource.DCR).exclude(
        pk__in=ClientAuthorization.objects.values("application_id"))
    beyond = list(pending.order_by("-created", "-pk").values_list("pk", flat=True)[max(keep, 1):])
    if not beyond:
        return 0
    return Application.objects.filter(pk__in=beyond).delete()[1].get(Application._meta.label, 0)


def end_tokens_of_inactive(*, user=None, agent: Agent | None = None) -> int:
    """A person or an agent was deactivated: the tokens and codes of every client acting for them end now,
    refresh tokens included, so neither a refresh nor a later reactivation brings any back. The
    authorisation stays (a person may authorise the client again). Returns how many authorisations."""
    whose = {"user": user} if user is not None else {"agent": agent}
    authorizations = ClientAuthorization.objects.filter(**whose)
    count = 0
    with transaction.atomic():
        for authorization in authorizations.select_related("application", "user"):
            _end_tokens(application=authorization.application, user=authorization.user)
            count += 1
    return count
