"""The Recorder's Ed25519 signing keys.

Private keys live in files under `settings.RECORDER_KEY_DIR` (outside the repository, mode 0600); public
keys live in the database with their validity windows and are never deleted, so a checkpoint signed by a
retired key still verifies. The newest key whose private file is present signs.
"""

import base64
import logging
import os
import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..models import RecorderKey
from . import sql
from .chain import b64url, public_key_from_text

logger = logging.getLogger(__name__)


def _path(key_id: str):
    return settings.RECORDER_KEY_DIR / f"{key_id}.ed25519"


_loaded: dict[tuple[str, str], Ed25519PrivateKey] = {}


def _load_private(key_id: str) -> Ed25519PrivateKey | None:
    # Kept in memory once read: a checkpoint is signed inside the journaling transaction.
    cache_key = (str(settings.RECORDER_KEY_DIR), key_id)
    if cache_key in _loaded:
        return _loaded[cache_key]
    path = _path(key_id)
    if not path.exists():
        return None
    _loaded[cache_key] = Ed25519PrivateKey.from_private_bytes(base64.b64decode(path.read_text().strip()))
    return _loaded[cache_key]


def create_key() -> RecorderKey:
    """Add a signing key; the previous one stops signing but its public key stays valid for verification."""
    private = Ed25519PrivateKey.generate()
    raw_public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    raw_private = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    key_id = "rk-" + timezone.now().strftime("%Y%m%d") + "-" + secrets.token_hex(4)
    settings.RECORDER_KEY_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = _path(key_id)
    # Created with 0600 from the start: the key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(raw_private).decode())
    now = timezone.now()
    with transaction.atomic():
        RecorderKey.objects.filter(origin="", valid_until__isnull=True).update(valid_until=now)
        return RecorderKey.objects.create(key_id=key_id, public_key=b64url(raw_public), valid_from=now)


def signing_key() -> tuple[str, Ed25519PrivateKey]:
    """The key that signs now, created on first use. Asked of the database at every checkpoint (another
    process may have rotated it), in one plain query: it is inside the journaling transaction."""
    row = sql.first_row(
        RecorderKey, ("key_id",), "origin = %s AND valid_until IS NULL ORDER BY valid_from DESC LIMIT 1", [""]
    )
    key_id = row[0] if row else None
    private = _load_private(key_id) if key_id else None
    if private is None:
        if key_id is not None:
            logger.warning("Recorder key %s has no private file in %s; adding a new key", key_id,
                           settings.RECORDER_KEY_DIR)
        key_id = create_key().key_id
        private = _load_private(key_id)
    assert private is not None and key_id is not None
    return key_id, private


def public_keys(origin: str = "") -> dict[str, Ed25519PublicKey]:
    """Every public key of one Recorder (this one by default), retired keys included."""
    return {
        key.key_id: public_key_from_text(key.public_key) for key in RecorderKey.objects.filter(origin=origin)
    }
