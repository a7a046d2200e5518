"""What an approver's passkey signs, as pure functions.

The WebAuthn challenge is the SHA-256 of the JCS bytes of `{plan, digest, decision, choices, nonce}`: the
plan's id, the digest of its content with the approver's conflict choices applied, approve or reject, those
choices, and a one-time nonce. Anyone holding the stored assertion, the approval's fields and the public key
can recompute the challenge and check the signature offline.
"""

import hashlib
from datetime import datetime, timedelta
from typing import Any

from journal.errors import Refused
from journal.record.canonical import canonical_bytes

from .planning import KEEP_NEWER, OVERWRITE

APPROVE, REJECT = "approve", "reject"
DECISIONS = (APPROVE, REJECT)
CHOICES = (KEEP_NEWER, OVERWRITE)


class SigningRefused(Refused):
    """Not something this person may sign now; `message` says why."""


def challenge_payload(
    *, plan: str, digest: str, decision: str, choices: dict[str, str], nonce: str
) -> dict[str, Any]:
    return {"plan": plan, "digest": digest, "decision": decision, "choices": choices, "nonce": nonce}


def action_payload(*, action: str, digest: str, decision: str, nonce: str) -> dict[str, Any]:
    """What a decision on a held call signs: the request, the digest of the exact call, the decision, a
    nonce."""
    return {"action": action, "digest": digest, "decision": decision, "nonce": nonce}


def challenge(payload: dict[str, Any]) -> bytes:
    return hashlib.sha256(canonical_bytes(payload)).digest()


def clean_choices(raw: Any, *, conflicts: set[int], decision: str) -> dict[str, str]:
    """The approver's choice for every conflict, keyed by item position (as text, for JSON). Approving
    needs a choice on each conflict; nothing else may be chosen."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SigningRefused("Conflict choices must map item positions to a choice.")
    choices: dict[str, str] = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isdigit() and key == str(int(key)) and int(key) in conflicts):
            raise SigningRefused(f"Item {key} has no conflict to choose on.")
        if value not in CHOICES:
            raise SigningRefused(
                f"Item {key}: choose to keep the newer change or to overwrite the version you saw."
            )
        choices[key] = value
    missing = sorted(conflicts - {int(k) for k in choices})
    if decision == APPROVE and missing:
        raise SigningRefused("Choose what to do about each change made since the agent acted (item "
                             + ", ".join(map(str, missing)) + ").")
    return choices


REASON_LENGTH = 1000  # an override's reason: a few sentences, read by every other approver


def clean_overrides(raw: Any, *, choices: dict[str, str], decision: str) -> dict[str, str]:
    """Why the approver overwrites each newer change they chose to overwrite (item position as text -> their
    words). Approving an overwrite needs a reason: the other approvers read it before they sign, and it is
    journaled. A reason goes with an overwrite and nothing else; a rejection carries none."""
    if decision != APPROVE:
        return {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SigningRefused("Override reasons must map item positions to your words.")
    overwrites = {key for key, choice in choices.items() if choice == OVERWRITE}
    reasons: dict[str, str] = {}
    for key, value in raw.items():
        if key not in overwrites:
            raise SigningRefused(f"Item {key}: a reason goes with an overwrite, and it is not one.")
        if not isinstance(value, str):
            raise SigningRefused(f"Item {key}: the reason must be text.")
        if len(value.strip()) > REASON_LENGTH:
            raise SigningRefused(f"Item {key}: keep the reason under {REASON_LENGTH} characters.")
        if value.strip():
            reasons[key] = value.strip()
    missing = sorted(overwrites - reasons.keys(), key=int)
    if missing:
        raise SigningRefused("Overwriting a newer change is an override: say why, the other approvers read "
                             "it (item " + ", ".join(missing) + ").")
    return reasons


def expiry(*, now: datetime, valid_for: timedelta, deadlines: list[datetime]) -> datetime:
    """An approval lasts `valid_for`, and never past the earliest undo deadline in the plan."""
    return min([now + valid_for, *deadlines])


def content_changes(signed: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What changed between the content an approver signed and the plan now, in words for them."""
    before = {i["position"]: i for i in signed.get("items", [])}
    after = {i["position"]: i for i in current.get("items", [])}
    changes = []
    for position in sorted(before.keys() | after.keys()):
        old, new = before.get(position), after.get(position)
        if old is None or new is None:
            gone = old or new
            changes.append(f"Step {gone.get('step')} was {'added' if old is None else 'removed'}.")
            continue
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                changes.append(f"Step {new.get('step')}: {_describe(key, old.get(key), new.get(key))}")
    for key in sorted((signed.keys() | current.keys()) - {"items"}):
        if signed.get(key) != current.get(key):
            changes.append(f"The plan's {key} changed.")
    return changes


# How a change to an item reads: a check's status and an approver's choice in the page's own words.
_CHECKS = {"ok": "would work now", "conflict": "changed since", "expired": "window closed",
           "unavailable": "server unavailable", "error": "error", "pending": "waiting", "": "not checked"}
CHOICE_WORDS = {"": "not chosen", "keep_newer": "keep the newer change", "overwrite": "undo it anyway"}


def _describe(key: str, old: Any, new: Any) -> str:
    if key == "check":
        before, after = ((value or {}).get("status") or "" for value in (old, new))
        return f"its check went from “{_CHECKS.get(before, before)}” to “{_CHECKS.get(after, after)}”."
    if key == "conflictChoice":
        before, after = (CHOICE_WORDS.get(value or "", value) for value in (old, new))
        return f"the choice went from “{before}” to “{after}”."
    if key == "overrideReason":
        return f"the reason to overwrite went from “{old or 'none'}” to “{new or 'none'}”."
    return f"{key} changed."
