"""The run record: a hash chain of events with signed checkpoints (docs/design.md, "Runs and the run record").

An entry is `{"seq", "ts", "event", "data", "prevHash", "hash"}`; the first `prevHash` is "GENESIS" and
`hash` is the SHA-256 hex of the JCS bytes of the entry without `hash`. A checkpoint `{run, seq, headHash}`
is signed with the Recorder's Ed25519 key. Everything here is pure: the offline verifier in the README
repeats the same few rules with nothing but `cryptography` and a JCS library.
"""

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .canonical import canonical_bytes, sha256_hex, to_ijson

GENESIS = "GENESIS"
FIRST_SEQ = 1
# The first entry of every run: who ran it, for whom, when, and which Recorder kept it, so a signature over
# the chain covers them too (a bundle's run header must equal it).
HEADER_EVENT = "run"


def header(
    *, run: str, agent: str, on_behalf_of: str | None, started_at: str, recorder: str
) -> dict[str, Any]:
    return {
        "id": run,
        "agent": agent,
        "onBehalfOf": on_behalf_of,
        "startedAt": started_at,
        "recorder": recorder,
    }


def format_ts(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, the one timestamp form the chain uses."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def make_entry(*, seq: int, ts: str, event: str, data: Any, prev_hash: str) -> dict[str, Any]:
    body = {"seq": seq, "ts": ts, "event": event, "data": to_ijson(data), "prevHash": prev_hash}
    return {**body, "hash": sha256_hex(body)}


def entry_hash(entry: Mapping[str, Any]) -> str:
    return sha256_hex({key: value for key, value in entry.items() if key != "hash"})


def checkpoint_payload(*, run: str, seq: int, head_hash: str) -> dict[str, Any]:
    return {"run": run, "seq": seq, "headHash": head_hash}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))



def public_key_from_text(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from its base64url text; ValueError if it is not one."""
    return Ed25519PublicKey.from_public_bytes(b64url_decode(text))

def sign(private_key: Ed25519PrivateKey, payload: Any) -> str:
    return b64url(private_key.sign(canonical_bytes(payload)))


def signature_valid(public_key: Ed25519PublicKey, payload: Any, signature: str) -> bool:
    try:
        public_key.verify(b64url_decode(signature), canonical_bytes(payload))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class Verdict:
    ok: bool
    entries: int
    checkpoints: int
    bad_seq: int | None = None
    problem: str = ""

    def __str__(self) -> str:
        if self.ok:
            entries = f"{self.entries} entr{'y' if self.entries == 1 else 'ies'}"
            checkpoints = f"{self.checkpoints} signed checkpoint{'' if self.checkpoints == 1 else 's'}"
            return f"intact: {entries}, {checkpoints}"
        where = f"entry {self.bad_seq}" if self.bad_seq is not None else "the record"
        return f"broken at {where}: {self.problem}"


def verify(
    *,
    run: str,
    entries: Iterable[Mapping[str, Any]],
    checkpoints: Iterable[Mapping[str, Any]],
    public_keys: Mapping[str, Ed25519PublicKey],
) -> Verdict:
    """Check a run's chain and its checkpoints; name the first entry that does not fit.

    `entries` must be in stored order (by position, not sorted by `seq`): a reordering is only visible
    if the verifier reads the entries as they were kept. Each checkpoint is `{"run", "seq", "headHash",
    "keyId", "signature"}`. A checkpoint beyond the last entry means the tail was cut.
    """
    hashes: dict[int, str] = {}
    expected_seq, prev = FIRST_SEQ, GENESIS
    count = 0
    for entry in entries:
        count += 1
        seq = entry.get("seq")
        if seq != expected_seq:
            return Verdict(False, count, 0, expected_seq, f"expected seq {expected_seq}, found {seq!r}")
        if entry.get("prevHash") != prev:
            return Verdict(False, count, 0, seq, "prevHash does not match the previous entry's hash")
        try:
            recomputed = entry_hash(entry)
        except Exception as exc:  # a tampered entry may not even be canonicalisable
            return Verdict(False, count, 0, seq, f"cannot canonicalise: {exc}")
        if entry.get("hash") != recomputed:
            return Verdict(False, count, 0, seq, "content does not match its hash")
        hashes[seq] = prev = recomputed
        expected_seq += 1

    last_seq = expected_seq - 1
    checked = 0
    for checkpoint in checkpoints:
        checked += 1
        seq = checkpoint.get("seq")
        if checkpoint.get("run") != run:
            return Verdict(False, count, checked, None, f"checkpoint for seq {seq} names another run")
        key = public_keys.get(checkpoint.get("keyId", ""))
        payload = checkpoint_payload(run=run, seq=seq, head_hash=checkpoint.get("headHash"))
        if key is None or not signature_valid(key, payload, checkpoint.get("signature", "")):
            return Verdict(False, count, checked, seq, "checkpoint signature does not verify")
        if not isinstance(seq, int) or seq > last_seq:
            return Verdict(
                False,
                count,
                checked,
                last_seq + 1,
                f"a signed checkpoint covers seq {seq}; entries after {last_seq} were cut",
            )
        if hashes.get(seq) != checkpoint.get("headHash"):
            return Verdict(
                False, count, checked, seq, "entry differs from the one a signed checkpoint covers"
            )
    return Verdict(True, count, checked)
