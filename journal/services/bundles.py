"""The run record as a whole: verify a run's chain, export it as a bundle, import another Recorder's bundle
or a ChronoMCP audit log (all or nothing, after verifying it)."""

import uuid
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import chain, keys, ports, sql
from ..bundle import (
    ImportRefused,
    aware_moment,
    parse_bundle,
    parse_chronomcp_log,
    parse_ts,
    step_fields,
    verify_bundle,
)
from ..canonical import to_ijson
from ..models import ChainEntry, Checkpoint, RecorderKey, Run, Step
from .record import append_entry, checkpoint_run, open_run, sign_checkpoint
from .steps import count

# A chain entry as the wire has it, read as plain rows (no model instance per entry).
_COLUMNS = ("seq", "ts", "event", "data", "prev_hash", "hash")
_WIRE = ("seq", "ts", "event", "data", "prevHash", "hash")


def _wire(entries) -> Iterator[dict[str, Any]]:
    """Chain entries (a query) as the wire has them, read in chunks."""
    for row in entries.values_list(*_COLUMNS).iterator(chunk_size=2000):
        yield dict(zip(_WIRE, row, strict=True))


def verify_run(*, run: Run) -> chain.Verdict:
    """Check a run's chain and checkpoints. Entries are read in the order they were stored (by row id), not
    sorted by `seq`, so a reordering shows up as a wrong seq."""
    entries = _wire(run.entries.order_by("id"))
    checkpoints = [
        checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")
    ]
    return chain.verify(
        run=str(run.public_id), entries=entries, checkpoints=checkpoints,
        public_keys=keys.public_keys(origin=run.imported_from if run.state == Run.State.IMPORTED else ""),
    )


def export_bundle(*, run: Run) -> dict[str, Any]:
    """The run's record as a self-contained bundle; signs the head first so the whole chain is covered. The
    run header is the chain's first entry (runs recorded before headers were signed have none: theirs is
    rebuilt from the run, and another Recorder will refuse it)."""
    checkpoint_run(run=run)
    run.refresh_from_db()
    origin = run.imported_from if run.state == Run.State.IMPORTED else ""
    first = run.entries.order_by("seq").first()
    if first is not None and first.event == chain.HEADER_EVENT:
        header = first.data
    else:
        header = chain.header(
            run=str(run.public_id), agent=run.agent_name,
            on_behalf_of=run.agent.on_behalf_of.get_username() if run.agent_id else None,
            started_at=run.started_at.isoformat(), recorder=origin or settings.PUBLIC_URL)
    return {
        "format": "agent-undo/run-bundle@1",
        "run": header,
        "entries": list(_wire(run.entries.order_by("seq"))),
        "checkpoints": [
            checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")
        ],
        "publicKeys": [key.as_wire() for key in RecorderKey.objects.filter(origin=origin)],
        "approvals": ports.signed_decisions(run),  # the approval side owns them; an imported run has none
    }


# How far a foreign Recorder's clock may run ahead of ours.
CLOCK_SKEW = timedelta(minutes=5)


def import_bundle(*, text: str) -> Run:
    """Import another Recorder's bundle after verifying it; all or nothing.

    The bundle is foreign: its keys are stored as its Recorder's (never this one's), and the first bundle
    from a Recorder pins the keys that signed it, so a later bundle signed by another key for it is refused.
    The run header must be the chain's first entry, which the signatures cover."""
    bundle = parse_bundle(text, max_bytes=settings.RECORDER_IMPORT_MAX_BYTES)
    public_id = _check_origin(bundle)
    now = timezone.now()
    _check_keys(bundle, now=now)
    verdict = verify_bundle(bundle)
    if not verdict.ok:
        raise ImportRefused(f"the record does not verify: {verdict}")
    _check_coverage(bundle)
    _check_dates(bundle, now=now)
    pinned = _check_pinned(bundle)
    return _store(bundle, public_id=public_id, pin=not pinned)


def _check_origin(bundle) -> uuid.UUID:
    """The run's id, if it is new here and the bundle does not claim to come from this Recorder."""
    try:
        public_id = uuid.UUID(bundle.run.id)
    except ValueError:
        raise ImportRefused(f"run.id: {bundle.run.id!r} is not a UUID") from None
    if Run.objects.filter(public_id=public_id).exists():
        raise ImportRefused(f"run {public_id} is already here")
    origin = bundle.run.recorder
    if origin.rstrip("/") == settings.PUBLIC_URL.rstrip("/"):
        raise ImportRefused(
            f"run.recorder: the bundle says it comes from this Recorder ({origin}); a run "
            "recorded here is here already, and this Recorder's keys are never taken from a file"
        )
    return public_id


def _check_coverage(bundle) -> None:
    """Signed checkpoints cover every entry, in order, and the first entry is the run header as the bundle
    states it (so the signatures cover who ran it and where)."""
    if not bundle.checkpoints:
        raise ImportRefused("the bundle has no signed checkpoint, so nothing vouches for its entries")
    seqs = [checkpoint.seq for checkpoint in bundle.checkpoints]
    if seqs != sorted(set(seqs)):
        raise ImportRefused(
            "checkpoints: each covers a later entry than the one before; these repeat or go back"
        )
    if bundle.checkpoints[-1].seq != bundle.entries[-1].seq:
        raise ImportRefused(
            f"entries after seq {bundle.checkpoints[-1].seq} are not covered by a signed checkpoint"
        )
    first = bundle.entries[0]
    if first.event != chain.HEADER_EVENT:
        raise ImportRefused(
            f"entry 1 is a {first.event!r} event, not the run header, so nothing signs who ran it "
            "and where (a run recorded before headers were signed cannot be imported)"
        )
    if first.data != bundle.run.model_dump():
        different = sorted(k for k, v in bundle.run.model_dump().items()
                           if not isinstance(first.data, dict) or first.data.get(k) != v)
        raise ImportRefused(
            f"run: {', '.join(different) or 'the header'} differs from the signed header (entry 1)"
        )


def _check_pinned(bundle) -> dict[str, RecorderKey]:
    """The keys pinned for the bundle's Recorder by its first import; the bundle may neither change one nor
    be signed by another."""
    origin = bundle.run.recorder
    pinned = {key.key_id: key for key in RecorderKey.objects.filter(origin=origin)}
    signing = {checkpoint.keyId for checkpoint in bundle.checkpoints}
    for key in bundle.publicKeys:
        if key.keyId in pinned and pinned[key.keyId].public_key != key.publicKey:
            raise ImportRefused(
                f"publicKeys: {key.keyId} of {origin} differs from the key pinned when its first "
                "run was imported"
            )
    if pinned and not signing <= set(pinned):
        raise ImportRefused(
            f"publicKeys: {', '.join(sorted(signing - set(pinned)))} is not a key of {origin}: that "
            f"Recorder's "
            f"keys were pinned when its first run was imported ({', '.join(sorted(pinned))}), and a bundle "
            f"cannot "
            "add one"
        )
    return pinned


def _store(bundle, *, public_id: uuid.UUID, pin: bool) -> Run:
    """The verified run, its chain, checkpoints and steps, in one transaction; with `pin` (trust on first
    use), the keys that signed it, never others the file lists."""
    origin = bundle.run.recorder
    entries = [entry.model_dump() for entry in bundle.entries]
    signing = {checkpoint.keyId for checkpoint in bundle.checkpoints}
    with transaction.atomic():
        run = Run.objects.create(
            public_id=public_id,
            state=Run.State.IMPORTED,
            imported_from=origin,
            agent_label=bundle.run.agent,
            started_at=aware_moment(bundle.run.startedAt),
            last_activity_at=bundle.entries[-1].moment,
            head_seq=entries[-1]["seq"],
            head_hash=entries[-1]["hash"],
            checkpointed_seq=bundle.checkpoints[-1].seq,
        )
        sql.insert_many(ChainEntry, [
            {"run_id": run.pk, "seq": e["seq"], "ts": e["ts"], "event": e["event"], "data": e["data"],
             "prev_hash": e["prevHash"], "hash": e["hash"]} for e in entries])
        Checkpoint.objects.bulk_create([
            Checkpoint(run=run, seq=c.seq, head_hash=c.headHash, key_id=c.keyId, signature=c.signature)
            for c in bundle.checkpoints
        ])
        if pin:
            assert origin, "an imported key always names its Recorder"
            RecorderKey.objects.bulk_create(
                [
                    RecorderKey(
                        origin=origin,
                        key_id=key.keyId,
                        public_key=key.publicKey,
                        valid_from=key.window[0],
                        valid_until=key.window[1],
                    )
                    for key in bundle.publicKeys
                    if key.keyId in signing
                ]
            )
        steps = step_fields(entries, started_at=run.started_at)
        sql.insert_many(Step, [{"run_id": run.pk, **fields} for fields in steps])
        _recount(run, [SimpleNamespace(status=fields.get("status", Step.Status.PENDING),
                                       reversibility=fields.get("reversibility", Step.Reversibility.UNKNOWN))
                       for fields in steps])
        run.save()
    return run


def _check_keys(bundle, *, now) -> None:
    seen = set()
    for key in bundle.publicKeys:
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


def _check_dates(bundle, *, now) -> None:
    """No entry from the future, and no checkpoint signed by a key retired before its entries were written."""
    for entry in bundle.entries:
        if entry.moment > now + CLOCK_SKEW:
            raise ImportRefused(f"entry {entry.seq} is dated {entry.ts}, which has not come yet")
    windows = {key.keyId: key.window for key in bundle.publicKeys}
    by_seq = {entry.seq: entry for entry in bundle.entries}
    for checkpoint in bundle.checkpoints:
        valid_until = windows[checkpoint.keyId][1]
        head = by_seq[checkpoint.seq]
        if valid_until is not None and head.moment > valid_until + CLOCK_SKEW:
            raise ImportRefused(
                f"checkpoint {checkpoint.seq} is signed by {checkpoint.keyId}, which was retired "
                f"({valid_until.isoformat()}) before entry {checkpoint.seq} was written ({head.ts})"
            )


def _recount(run: Run, steps: list) -> None:
    """The run list's counters of an imported run, from its steps' status and reversibility."""
    run.step_count = len(steps)
    for step in steps:
        count(run, step, acted=step.status == Step.Status.OK)
    run.state = Run.State.IMPORTED


def import_chronomcp_log(*, text: str, source: str) -> Run:
    """Import a ChronoMCP audit log after verifying its own chain. Its entries are kept verbatim inside a
    new chain of ours (their hashes use JSON.stringify, ours JCS), which this Recorder then signs."""
    if len(text) > settings.RECORDER_IMPORT_MAX_BYTES:
        raise ImportRefused(f"the audit log is over {settings.RECORDER_IMPORT_MAX_BYTES} bytes "
                            "(RECORDER_IMPORT_MAX_BYTES)")
    parsed = parse_chronomcp_log(text)
    key = f"chronomcp:{parsed[-1][1].hash}"
    if Run.objects.filter(key=key).exists():
        raise ImportRefused("this audit log (same last hash) was imported before")
    now = timezone.now()
    first_ts = parse_ts(parsed[0][1].ts, now)
    with transaction.atomic():
        # A chain of ours (this Recorder signs it) around theirs: open until the last entry is in.
        run = open_run(agent=None, key=key, now=now, started_at=first_ts, label="chronomcp")
        append_entry(
            run=run,
            event="imported",
            now=now,
            data={
                "format": "chronomcp-audit-log",
                "source": source,
                "entries": len(parsed),
                "headHash": parsed[-1][1].hash,
            },
        )
        steps = []
        for line, (raw, entry) in enumerate(parsed, start=1):
            append_entry(run=run, event="chronomcp", now=now, data={"line": line, "entry": raw})
            if entry.tool:
                arguments = entry.data.get("args", entry.data.get("arguments", entry.data))
                steps.append(
                    Step(
                        run=run,
                        number=len(steps) + 1,
                        server_name="chronomcp",
                        tool=entry.tool[:200],
                        arguments=to_ijson(
                            arguments if isinstance(arguments, dict) else {"value": arguments}
                        ),
                        started_at=parse_ts(entry.ts, now),
                        finished_at=parse_ts(entry.ts, now),
                        status=Step.Status.OK,
                        declaration_source="none",
                        reversibility=Step.Reversibility.UNKNOWN,
                        effect_summary=f"ChronoMCP {entry.kind}"[:500],
                    )
                )
        Step.objects.bulk_create(steps)
        sign_checkpoint(run=run, now=now)
        _recount(run, steps)
        run.last_activity_at = parse_ts(parsed[-1][1].ts, now)
        run.save()
    return run

