"""Another Recorder's bundle imported, all or nothing, after verifying it, read as a stream: its entries are
checked and stored a batch at a time as they are read, so a run of any length is imported in memory bounded
by one batch (docs/design.md, "Runs and the run record").

The bundle is foreign: its keys are stored as its Recorder's (never this one's), and the first bundle from a
Recorder pins the keys that signed it, so a later bundle signed by another key for it is refused. The run
header must be the chain's first entry, which the signatures cover. Every check a whole bundle had is made
before its transaction commits; any refusal rolls back what was written.
"""

import io
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..models import ChainEntry, Checkpoint, RecorderKey, Run, Step, Team
from ..record import chain, sql, strict_json
from ..record.bundle import BUNDLE_MAX_DEPTH, ImportRefused, StepBuilder, aware_moment, read_entry, read_head
from ..record.json_stream import ObjectStream
from .steps import count

# How far a foreign Recorder's clock may run ahead of ours.
CLOCK_SKEW = timedelta(minutes=5)
# The members that vouch for the entries: once read, entries that follow are stored as they are read.
_HEAD = ("format", "run", "checkpoints", "publicKeys")
# Entries (and the steps they finish) written per statement batch.
_BATCH = 1000


def import_bundle(*, text: str | None = None, path: Path | None = None, team: Team | None = None) -> Run:
    """Import a bundle, given as `text` or a file's `path`, after verifying it; all or nothing. The run
    belongs to `team` (default: the default team).

    One pass when its entries come after the members that vouch for them (as `export_run` writes it), two
    when they come first: the first reads the other members, the second the entries."""
    if path is not None:
        size = path.stat().st_size

        def opened() -> IO:
            return path.open("rb")
    else:
        size = len(text.encode("utf-8", errors="surrogatepass"))

        def opened() -> IO:
            return io.StringIO(text)
    limit = settings.RECORDER_IMPORT_MAX_BYTES
    if size > limit:
        raise ImportRefused(f"the bundle is {size} bytes; the limit is {limit}")
    with transaction.atomic():
        members, stored = _read(opened, head=None, team=team)
        if stored is None:
            if "entries" not in members:
                raise ImportRefused("entries: Field required")
            _, stored = _read(opened, head=_without_entries(members), team=team)
        read_head(_without_entries(members))  # the members after the entries too

        return stored.finish()


def _read(
    opened: Callable[[], IO], *, head: dict[str, Any] | None, team: Team | None
) -> tuple[dict[str, Any], "_Import | None"]:
    """One pass: the members but the entries (as read in this pass), and the import when the entries could
    be stored in it (they came after `_HEAD`, or `head` was read in a first pass). An `entries` member
    skipped is `True` in the members."""
    members: dict[str, Any] = {}
    stored = None
    try:
        with opened() as source:
            stream = ObjectStream(source, max_bytes=settings.RECORDER_IMPORT_MAX_BYTES,
                                  max_depth=BUNDLE_MAX_DEPTH, what="the bundle")
            for key in stream.keys():
                if key != "entries":
                    members[key] = stream.value()
                    continue
                members[key] = True
                if not stream.is_array():
                    raise ImportRefused("entries: Input should be a valid list")
                if head is None and not all(name in members for name in _HEAD):
                    for _ in stream.items():  # read in the second pass, once the rest is known
                        pass
                    continue
                stored = _Import(read_head(head if head is not None else _without_entries(members)),
                                 team=team)
                stored.add(stream.items())
    except strict_json.JsonRefused as exc:
        raise ImportRefused(str(exc)) from None
    return members, stored


def _without_entries(members: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in members.items() if key != "entries"}


class _Import:
    """One bundle's run being stored: the checks on its head made when it is created, each entry checked and
    kept as it comes (`add`), the checks on the whole record at the end (`finish`)."""

    def __init__(self, head, *, team: Team | None) -> None:
        self.head, self.now = head, timezone.now()
        public_id = _check_origin(head)
        _check_keys(head, now=self.now)
        _check_checkpoints(head)
        self.pin = not _check_pinned(head)
        self.keys = {}
        for key in head.publicKeys:
            try:
                self.keys[key.keyId] = chain.public_key_from_text(key.publicKey)
            except ValueError:
                raise ImportRefused(f"publicKeys: {key.keyId} is not an Ed25519 public key") from None
        self.windows = {key.keyId: key.window for key in head.publicKeys}
        self.signed = {checkpoint.seq: checkpoint for checkpoint in head.checkpoints}
        self.check = chain.ChainCheck(covered=set(self.signed))
        self.run = Run.objects.create(
            public_id=public_id, state=Run.State.IMPORTED, imported_from=head.run.recorder,
            agent_label=head.run.agent, started_at=aware_moment(head.run.startedAt),
            checkpointed_seq=head.checkpoints[-1].seq, team=team or Team.objects.default(),
        )
        self.steps = StepBuilder(started_at=self.run.started_at)
        self.rows: list[dict[str, Any]] = []
        self.last = None

    def add(self, items: Iterable[Any]) -> None:
        for index, raw in enumerate(items):
            entry = read_entry(raw, index)
            broken, data = self.check.add(raw)
            if broken is not None:
                raise ImportRefused(f"the record does not verify: {broken}")
            if index == 0:
                _check_header(entry, self.head)
            moment = entry.moment
            if moment > self.now + CLOCK_SKEW:
                raise ImportRefused(f"entry {entry.seq} is dated {entry.ts}, which has not come yet")
            if entry.seq in self.signed:
                self._check_window(self.signed[entry.seq], entry, moment)
            self.rows.append({
                "run_id": self.run.pk, "seq": entry.seq, "ts": entry.ts, "event": entry.event,
                "data": sql.JsonText(data.decode("utf-8")) if data is not None else entry.data,
                "prev_hash": entry.prevHash, "hash": entry.hash})
            self.steps.add(raw)
            self.last = (entry, moment)
            if len(self.rows) >= _BATCH:
                self._flush()

    def _check_window(self, checkpoint, entry, moment) -> None:
        """No checkpoint signed by a key retired before the entry it covers was written."""
        valid_until = self.windows.get(checkpoint.keyId, (None, None))[1]
        if valid_until is not None and moment > valid_until + CLOCK_SKEW:
            raise ImportRefused(
                f"checkpoint {checkpoint.seq} is signed by {checkpoint.keyId}, which was retired "
                f"({valid_until.isoformat()}) before entry {checkpoint.seq} was written ({entry.ts})"
            )

    def _flush(self, steps: list[dict[str, Any]] | None = None) -> None:
        sql.insert_many(ChainEntry, self.rows)
        self.rows = []
        steps = self.steps.take() + (steps or [])
        sql.insert_many(Step, [{"run_id": self.run.pk, **fields} for fields in steps], parsed=True)
        for fields in steps:
            step = SimpleNamespace(status=fields.get("status", Step.Status.PENDING),
                                   reversibility=fields.get("reversibility", Step.Reversibility.UNKNOWN))
            count(self.run, step, acted=step.status == Step.Status.OK)
            self.run.step_count += 1

    def finish(self) -> Run:
        """The whole record's checks; then the checkpoints, the keys to pin and the run's own columns."""
        if self.last is None:
            raise ImportRefused("entries: the bundle has no entries")
        head, (last, moment) = self.head, self.last
        verdict = self.check.finish(run=head.run.id, public_keys=self.keys,
                                    checkpoints=[checkpoint.model_dump() for checkpoint in head.checkpoints])
        if not verdict.ok:
            raise ImportRefused(f"the record does not verify: {verdict}")
        if head.checkpoints[-1].seq != last.seq:
            raise ImportRefused(
                f"entries after seq {head.checkpoints[-1].seq} are not covered by a signed checkpoint"
            )
        self._flush(self.steps.unfinished())
        run = self.run
        Checkpoint.objects.bulk_create([
            Checkpoint(run=run, seq=c.seq, head_hash=c.headHash, key_id=c.keyId, signature=c.signature)
            for c in head.checkpoints
        ])
        if self.pin:
            RecorderKey.objects.bulk_create([
                RecorderKey(origin=head.run.recorder, key_id=key.keyId, public_key=key.publicKey,
                            valid_from=key.window[0], valid_until=key.window[1])
                for key in head.publicKeys if key.keyId in {c.keyId for c in head.checkpoints}
            ])
        run.last_activity_at, run.head_seq, run.head_hash = moment, last.seq, last.hash
        run.state = Run.State.IMPORTED
        run.save()
        return run


def _check_origin(head) -> uuid.UUID:
    """The run's id, if it is new here and the bundle does not claim to come from this Recorder."""
    try:
        public_id = uuid.UUID(head.run.id)
    except ValueError:
        raise ImportRefused(f"run.id: {head.run.id!r} is not a UUID") from None
    if Run.objects.filter(public_id=public_id).exists():
        raise ImportRefused(f"run {public_id} is already here")
    origin = head.run.recorder
    if origin.rstrip("/") == settings.PUBLIC_URL.rstrip("/"):
        raise ImportRefused(
            f"run.recorder: the bundle says it comes from this Recorder ({origin}); a run "
            "recorded here is here already, and this Recorder's keys are never taken from a file"
        )
    return public_id


def _check_checkpoints(head) -> None:
    """Signed checkpoints exist and each covers a later entry than the one before (that they cover every
    entry is checked once the last entry is read)."""
    if not head.checkpoints:
        raise ImportRefused("the bundle has no signed checkpoint, so nothing vouches for its entries")
    seqs = [checkpoint.seq for checkpoint in head.checkpoints]
    if seqs != sorted(set(seqs)):
        raise ImportRefused(
            "checkpoints: each covers a later entry than the one before; these repeat or go back"
        )


def _check_header(first, head) -> None:
    """The first entry is the run header as the bundle states it (so the signatures cover who ran it and
    where)."""
    if first.event != chain.HEADER_EVENT:
        raise ImportRefused(
            f"entry 1 is a {first.event!r} event, not the run header, so nothing signs who ran it "
            "and where (a run recorded before headers were signed cannot be imported)"
        )
    stated = head.run.model_dump()
    if first.data != stated:
        different = sorted(k for k, v in stated.items() if not isinstance(first.data, dict)
                           or first.data.get(k) != v)
        raise ImportRefused(
            f"run: {', '.join(different) or 'the header'} differs from the signed header (entry 1)"
        )


def _check_pinned(head) -> dict[str, RecorderKey]:
    """The keys pinned for the bundle's Recorder by its first import; the bundle may neither change one nor
    be signed by another."""
    origin = head.run.recorder
    pinned = {key.key_id: key for key in RecorderKey.objects.filter(origin=origin)}
    signing = {checkpoint.keyId for checkpoint in head.checkpoints}
    for key in head.publicKeys:
        if key.keyId in pinned and pinned[key.keyId].public_key != key.publicKey:
            raise ImportRefused(
                f"publicKeys: {key.keyId} of {origin} differs from the key pinned when its first "
                "run was imported"
            )
    if pinned and not signing <= set(pinned):
        raise ImportRefused(
            f"publicKeys: {', '.join(sorted(signing - set(pinned)))} is not a key of {origin}: that "
            f"Recorder's keys were pinned when its first run was imported ({', '.join(sorted(pinned))}), "
            "and a bundle cannot add one"
        )
    return pinned


def _check_keys(head, *, now) -> None:
    seen = set()
    for key in head.publicKeys:
        if key.keyId in seen:
            raise ImportRefused(f"publicKeys: {key.keyId} is listed twice")
        seen.add(key.keyId)
        valid_from, valid_until = key.window
        if valid_from > now + CLOCK_SKEW:
            raise ImportRefused(
                f"publicKeys: {key.keyId} is valid only from {key.validFrom}, which has not come yet"
            )
        if valid_until is not None and valid_until < valid_from:
            raise ImportRefused(
                f"publicKeys: {key.keyId} stops being valid ({key.validUntil}) before it starts "
                f"({key.validFrom})"
            )
