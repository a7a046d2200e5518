"""The run record: a hash chain of events with signed checkpoints (docs/design.md, "Runs and the run record").

An entry is `{"seq", "ts", "event", "data", "prevHash", "hash"}`; the first `prevHash` is "GENESIS" and
`hash` is the SHA-256 hex of the JCS bytes of the entry without `hash`. A checkpoint `{run, seq, headHash}`
is signed with the Recorder's Ed25519 key. Everything here is pure: the offline verifier in the README
repeats the same few rules with nothing but `cryptography` and a JCS library.
"""

import base64
import hashlib
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
    return new_entry(seq=seq, ts=ts, event=event, data=data, prev_hash=prev_hash)[0]


def written_entry(*, seq: int, ts: str, event: str, data_bytes: bytes, prev_hash: str) -> dict[str, Any]:
    """An entry whose data was written beforehand (its JCS bytes): its members but `data`, and its hash."""
    whole = _whole(data_bytes, event=event, prev_hash=prev_hash, seq=seq, ts=ts)
    digest = hashlib.sha256(whole).hexdigest()
    return {"seq": seq, "ts": ts, "event": event, "prevHash": prev_hash, "hash": digest}


def new_entry(*, seq: int, ts: str, event: str, data: Any, prev_hash: str) -> tuple[dict[str, Any], bytes]:
    """The entry (`make_entry`) and the JCS bytes of its `data`, written on the way to its hash, for the
    caller to store as they are."""
    body = {"seq": seq, "ts": ts, "event": event, "data": to_ijson(data), "prevHash": prev_hash}
    digest, data_bytes = entry_digest(body)
    return {**body, "hash": digest}, data_bytes if data_bytes is not None else canonical_bytes(body["data"])


# An entry's members, sorted as JCS sorts them (by UTF-16 code units), without `hash`.
_BODY = ("data", "event", "prevHash", "seq", "ts")


def entry_hash(entry: Mapping[str, Any]) -> str:
    return entry_digest(entry)[0]


def entry_digest(entry: Mapping[str, Any]) -> tuple[str, bytes | None]:
    """An entry's hash (everything but `hash` itself), and the JCS bytes of its `data` when they were
    written on the way, so a caller storing the entry need not write them again (None otherwise).

    An entry of exactly the five members, its scalars of their own types, is hashed from its members' JCS
    bytes joined in JCS's order, which are by definition the bytes of the whole object; anything else (a
    tampered entry with another member, a seq that is not an integer) is canonicalised whole."""
    if len(entry) - ("hash" in entry) == len(_BODY) and all(name in entry for name in _BODY):
        seq, ts, event, prev = entry["seq"], entry["ts"], entry["event"], entry["prevHash"]
        if type(seq) is int and type(ts) is str and type(event) is str and type(prev) is str:
            data = canonical_bytes(entry["data"])
            whole = _whole(data, event=event, prev_hash=prev, seq=seq, ts=ts)
            return hashlib.sha256(whole).hexdigest(), data
    return sha256_hex({key: value for key, value in entry.items() if key != "hash"}), None


def _whole(data: bytes, *, event: str, prev_hash: str, seq: int, ts: str) -> bytes:
    """An entry's JCS bytes (without `hash`) from its data's, its members joined in JCS's order.
    `journal.services.one_statement._hash_of` writes the same bytes in SQL: a change here is one there."""
    return b"".join((b'{"data":', data, b',"event":', _scalar(event), b',"prevHash":', _scalar(prev_hash),
                     b',"seq":', _scalar(seq), b',"ts":', _scalar(ts), b"}"))


def _scalar(value: int | str) -> bytes:
    """A seq, timestamp, event name or hash as JCS writes it: the usual ones (a safe integer, printable
    ASCII with nothing to escape) directly, anything else by the library."""
    if type(value) is int:
        if -(2**53) < value < 2**53:
            return str(value).encode()
    elif value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return b'"' + value.encode() + b'"'
    return canonical_bytes(value)


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


class ChainCheck:
    """A run's entries checked one at a time as they are read, so a record of any length is checked in
    constant memory: only the hashes of the entries a checkpoint covers are kept. `add` each entry in stored
    order (by position, not sorted by `seq`: a reordering is only visible if the entries are read as they
    were kept), then `finish` with the checkpoints."""

    def __init__(self, *, covered: set[Any] | None = None) -> None:
        self.count = 0
        self._covered = covered
        self._hashes: dict[int, str] = {}
        self._expected, self._prev = FIRST_SEQ, GENESIS

    def add(self, entry: Mapping[str, Any]) -> tuple[Verdict | None, bytes | None]:
        """The verdict if this entry breaks the chain (else None), and the JCS bytes of its data when they
        were written on the way (see `entry_digest`)."""
        self.count += 1
        seq, expected = entry.get("seq"), self._expected
        if seq != expected:
            return Verdict(False, self.count, 0, expected, f"expected seq {expected}, found {seq!r}"), None
        if entry.get("prevHash") != self._prev:
            problem = "prevHash does not match the previous entry's hash"
            return Verdict(False, self.count, 0, seq, problem), None
        try:
            recomputed, data = entry_digest(entry)
        except Exception as exc:  # a tampered entry may not even be canonicalisable
            return Verdict(False, self.count, 0, seq, f"cannot canonicalise: {exc}"), None
        if entry.get("hash") != recomputed:
            return Verdict(False, self.count, 0, seq, "content does not match its hash"), None
        if self._covered is None or seq in self._covered:
            self._hashes[seq] = recomputed
        self._prev, self._expected = recomputed, expected + 1
        return None, data

    def finish(
        self,
        *,
        run: str,
        checkpoints: Iterable[Mapping[str, Any]],
        public_keys: Mapping[str, Ed25519PublicKey],
    ) -> Verdict:
        """The verdict on the whole record: each checkpoint `{"run", "seq", "headHash", "keyId",
        "signature"}` names this run, is signed by one of `public_keys`, and covers an entry that was read
        with the hash it signs. A checkpoint beyond the last entry means the tail was cut."""
        count, last_seq, checked = self.count, self._expected - 1, 0
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
                return Verdict(False, count, checked, last_seq + 1,
                               f"a signed checkpoint covers seq {seq}; entries after {last_seq} were cut")
            if self._hashes.get(seq) != checkpoint.get("headHash"):
                return Verdict(
                    False, count, checked, seq, "entry differs from the one a signed checkpoint covers"
                )
        return Verdict(True, count, checked)


def verify(
    *,
    run: str,
    entries: Iterable[Mapping[str, Any]],
    checkpoints: Iterable[Mapping[str, Any]],
    public_keys: Mapping[str, Ed25519PublicKey],
) -> Verdict:
    """Check a run's chain and its checkpoints; name the first entry that does not fit (see `ChainCheck`).
    `entries` may be any iterable, read once, in stored order."""
    checkpoints = list(checkpoints)
    check = ChainCheck(covered={checkpoint.get("seq") for checkpoint in checkpoints
                                if isinstance(checkpoint.get("seq"), int)})
    for entry in entries:
        broken, _ = check.add(entry)
        if broken is not None:
            return broken
    return check.finish(run=run, checkpoints=checkpoints, public_keys=public_keys)
