"""The idempotency keys tool servers see: the Recorder's own, and the agents'. No ORM and no clock.

A server that honours an idempotency key answers a repeated key with the first outcome and does nothing. So
whoever can send a key another will send can make that other's call a no-op (or read its answer):
- the Recorder's own keys (an approved held call's, a plan's compensations') carry an HMAC of what they name,
  under a key derived from the secret key: nobody who reads a held call's or a plan's id (an agent is told
  both) can send one first;
- an agent's own key (`_meta["hatp/journal"]["idempotencyKey"]`) goes on namespaced by the agent, so it can
  neither be another agent's key nor one of the Recorder's.
"""

import hashlib
import hmac
import json
from typing import Any

from ..undo import declarations

KEY = "idempotencyKey"
_MAC_HEX = 32  # 128 bits: not guessable, and the key stays within the 200 characters a plan item keeps


def secret(secret_key: str) -> bytes:
    """The key the Recorder's own idempotency keys are derived with, from the shared SECRET_KEY (every
    Recorder process and worker derives the same)."""
    return hmac.new(secret_key.encode(), b"agent-undo: idempotency keys", hashlib.sha256).digest()


def recorder_key(secret: bytes, kind: str, *names: Any) -> str:
    """`kind:names…:mac`: readable in a server's log, stable for what it names (a retry is the same
    request), and unguessable without the secret."""
    named = ":".join(str(name) for name in (kind, *names))
    mac = hmac.new(secret, named.encode(), hashlib.sha256).hexdigest()[:_MAC_HEX]
    return f"{named}:{mac}"


def agent_key(agent_id: int, key: Any) -> str:
    """An agent's own key as servers see it: in the agent's namespace (a key that is not text is kept as its
    canonical JSON, so two different keys stay different)."""
    text = key if isinstance(key, str) else json.dumps(key, sort_keys=True, separators=(",", ":"))
    return f"agent-{agent_id}:{text}"


def namespaced_meta(meta: dict[str, Any] | None, agent_id: int) -> dict[str, Any] | None:
    """The agent's forwarded `_meta` with its own idempotency key, if it sent one, namespaced by the agent."""
    journal = (meta or {}).get(declarations.HATP_KEY)
    if not isinstance(journal, dict) or KEY not in journal:
        return meta
    return {**meta, declarations.HATP_KEY: {**journal, KEY: agent_key(agent_id, journal[KEY])}}
