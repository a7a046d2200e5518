"""Passkeys: enrolling an approver's WebAuthn credential, and revoking it."""

import hashlib
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import passkeys
from ..models import Passkey


def user_handle(user) -> bytes:
    """The WebAuthn user id: stable per account and free of personal data, as the spec asks."""
    return hashlib.sha256(f"agent-undo-user:{user.pk}".encode()).digest()[:16]


def passkey_registration_options(*, user, challenge: bytes) -> str:
    existing = list(Passkey.objects.filter(user=user).values_list("credential_id", flat=True))
    return passkeys.registration_options(
        rp=passkeys.this_site(), user_handle=user_handle(user), user_name=user.get_username(),
        display_name=user.get_full_name() or user.get_username(), existing=existing, challenge=challenge)


def enroll_passkey(*, user, name: str, credential: Any, challenge: bytes, now: datetime | None = None) -> Passkey:
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
    return bool(Passkey.objects.filter(pk=passkey.pk, revoked_at__isnull=True).update(revoked_at=now or timezone.now()))

