"""Passkeys: enrolling an approver's WebAuthn credential, and revoking it."""

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url

from .. import passkeys
from ..models import Passkey


def user_handle(user) -> bytes:
    """The WebAuthn user id: stable per account and free of personal data, as the spec asks."""
    return hashlib.sha256(f"agent-undo-user:{user.pk}".encode()).digest()[:16]


def begin_enrolment(*, user, now: datetime | None = None) -> tuple[dict[str, Any], str]:
    """A fresh one-time challenge for enrolling a passkey, minted here as sign-off challenges are: what to
    keep until the browser answers (in the person's session; `enrolment_challenge` redeems it) and the
    options for `navigator.credentials.create()`."""
    now = now or timezone.now()
    challenge = secrets.token_bytes(32)
    pending = {"challenge": bytes_to_base64url(challenge),
               "expires": (now + timedelta(seconds=passkeys.CHALLENGE_SECONDS)).timestamp()}
    return pending, passkey_registration_options(user=user, challenge=challenge)


def enrolment_challenge(*, pending: Any, now: datetime | None = None) -> bytes:
    """The challenge `begin_enrolment` kept, if it is still good; PasskeyRefused if it lapsed or is gone."""
    now = now or timezone.now()
    if not isinstance(pending, dict) or not isinstance(pending.get("challenge"), str) \
            or not isinstance(pending.get("expires"), int | float) or pending["expires"] < now.timestamp():
        raise passkeys.PasskeyRefused("The enrolment took too long or was already used; start again.")
    return base64url_to_bytes(pending["challenge"])


def passkey_registration_options(*, user, challenge: bytes) -> str:
    existing = list(Passkey.objects.filter(user=user).values_list("credential_id", flat=True))
    return passkeys.registration_options(
        rp=passkeys.this_site(), user_handle=user_handle(user), user_name=user.get_username(),
        display_name=user.get_full_name() or user.get_username(), existing=existing, challenge=challenge)


def enroll_passkey(
    *, user, name: str, credential: Any, challenge: bytes, now: datetime | None = None
) -> Passkey:
    """Keep a new passkey for `user` once its registration answers our challenge; PasskeyRefused if not."""
    name = (name or "").strip()[:100] or "Passkey"
    new = passkeys.verify_registration(rp=passkeys.this_site(), credential=credential, challenge=challenge)
    try:
        with transaction.atomic():
            return Passkey.objects.create(
                user=user, name=name, credential_id=new.credential_id, public_key=new.public_key,
                sign_count=new.sign_count, transports=new.transports, created_at=now or timezone.now())
    except IntegrityError:
        raise passkeys.PasskeyRefused("This passkey is already enrolled.") from None


def revoke_passkey(*, passkey: Passkey, now: datetime | None = None) -> bool:
    """A revoked passkey signs nothing more, and approvals it gave stop counting when a plan executes."""
    return bool(
        Passkey.objects.filter(pk=passkey.pk, revoked_at__isnull=True).update(
            revoked_at=now or timezone.now()
        )
    )
