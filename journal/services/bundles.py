"""The run record as a whole: verify a run's chain, export it as a bundle, import another Recorder's bundle
or a ChronoMCP audit log (all or nothing, after verifying it)."""

import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import chain, keys, ports
from ..bundle import ImportRefused, parse_bundle, parse_chronomcp_log, parse_ts, step_fields, verify_bundle
from ..canonical import to_ijson
from ..models import ChainEntry, Checkpoint, RecorderKey, Run, Step
from .record import append_entry, checkpoint_run, sign_checkpoint
from .steps import count


def verify_run(*, run: Run) -> chain.Verdict:
    """Check a run's chain and checkpoints. Entries are read in the order they were stored (by row id), not
    sorted by `seq`, so a reordering shows up as a wrong seq."""
    entries = (entry.as_wire() for entry in run.entries.order_by("id").iterator(chunk_size=2000))
    checkpoints = [checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")]
    return chain.verify(
        run=str(run.public_id), entries=entries, checkpoints=checkpoints,
        public_keys=keys.public_keys(origin=run.imported_from if run.state == Run.State.IMPORTED else ""),
    )


def export_bundle(*, run: Run) -> dict[str, Any]:
    """The run's record as a self-contained bundle; signs the head first so the whole chain is covered."""
    checkpoint_run(run=run)
    run.refresh_from_db()
    origin = run.imported_from if run.state == Run.State.IMPORTED else ""
    return {
        "format": "agent-undo/run-bundle@1",
        "run": {
            "id": str(run.public_id),
            "agent": run.agent_name,
            "onBehalfOf": run.agent.on_behalf_of.get_username() if run.agent_id else None,
            "startedAt": run.started_at.isoformat(),
            "recorder": origin or settings.PUBLIC_URL,
        },
        "entries": [entry.as_wire() for entry in run.entries.order_by("seq")],
        "checkpoints": [checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")],
        "publicKeys": [key.as_wire() for key in RecorderKey.objects.filter(origin=origin)],
        "approvals": ports.signed_decisions(run),  # the approval side owns them; an imported run has none
    }


def import_bundle(*, text: str) -> Run:
    """Import another Recorder's bundle after verifying it; all or nothing."""
    bundle = parse_bundle(text)
    try:
        public_id = uuid.UUID(bundle.run.id)
    except ValueError:
        raise ImportRefused(f"run.id: {bundle.run.id!r} is not a UUID") from None
    verdict = verify_bundle(bundle)
    if not verdict.ok:
        raise ImportRefused(f"the record does not verify: {verdict}")
    if not bundle.checkpoints:
        raise ImportRefused("the bundle has no signed checkpoint, so nothing vouches for its entries")
    if bundle.checkpoints[-1].seq != bundle.entries[-1].seq:
        raise ImportRefused(f"entries after seq {bundle.checkpoints[-1].seq} are not covered by a signed checkpoint")
    if Run.objects.filter(public_id=public_id).exists():
        raise ImportRefused(f"run {public_id} is already here")
    origin = bundle.run.recorder
    started = parse_ts(bundle.run.startedAt, timezone.now())
    entries = [entry.model_dump() for entry in bundle.entries]
    with transaction.atomic():
        run = Run.objects.create(
            public_id=public_id, state=Run.State.IMPORTED, imported_from=origin, agent_label=bundle.run.agent,
            started_at=started, last_activity_at=started,
            head_seq=entries[-1]["seq"], head_hash=entries[-1]["hash"], checkpointed_seq=bundle.checkpoints[-1].seq,
        )
        ChainEntry.objects.bulk_create([
            ChainEntry(run=run, seq=e["seq"], ts=e["ts"], event=e["event"], data=e["data"], prev_hash=e["prevHash"],
                       hash=e["hash"]) for e in entries
        ])
        Checkpoint.objects.bulk_create([
            Checkpoint(run=run, seq=c.seq, head_hash=c.headHash, key_id=c.keyId, signature=c.signature)
            for c in bundle.checkpoints
        ])
        for key in bundle.publicKeys:
            existing = RecorderKey.objects.filter(origin=origin, key_id=key.keyId).first()
            if existing and existing.public_key != key.publicKey:
                raise ImportRefused(f"publicKeys: {key.keyId} of {origin} differs from the key imported before")
            if not existing:
                RecorderKey.objects.create(
                    origin=origin, key_id=key.keyId, public_key=key.publicKey,
                    valid_from=parse_ts(key.validFrom, started),
                    valid_until=parse_ts(key.validUntil, None) if key.validUntil else None,
                )
        steps = [Step(run=run, **fields) for fields in step_fields(entries, started_at=run.started_at)]
        Step.objects.bulk_create(steps)
        _recount(run, steps)
        run.save()
    return run


def _recount(run: Run, steps: list[Step]) -> None:
    run.step_count = len(steps)
    for step in steps:
        count(run, step, acted=step.status == Step.Status.OK)
    run.state = Run.State.IMPORTED


def import_chronomcp_log(*, text: str, source: str) -> Run:
    """Import a ChronoMCP audit log after verifying its own chain. Its entries are kept verbatim inside a
    new chain of ours (their hashes use JSON.stringify, ours JCS), which this Recorder then signs."""
    parsed = parse_chronomcp_log(text)
    key = f"chronomcp:{parsed[-1][1].hash}"
    if Run.objects.filter(key=key).exists():
        raise ImportRefused("this audit log (same last hash) was imported before")
    now = timezone.now()
    first_ts = parse_ts(parsed[0][1].ts, now)
    with transaction.atomic():
        run = Run.objects.create(state=Run.State.IMPORTED, imported_from="", agent_label="chronomcp",
                                 key=key, started_at=first_ts,
                                 last_activity_at=parse_ts(parsed[-1][1].ts, now))
        append_entry(run=run, event="imported", now=now, data={
            "format": "chronomcp-audit-log", "source": source, "entries": len(parsed), "headHash": parsed[-1][1].hash})
        steps = []
        for line, (raw, entry) in enumerate(parsed, start=1):
            append_entry(run=run, event="chronomcp", now=now, data={"line": line, "entry": raw})
            if entry.tool:
                arguments = entry.data.get("args", entry.data.get("arguments", entry.data))
                steps.append(Step(
                    run=run, number=len(steps) + 1, server_name="chronomcp", tool=entry.tool[:200],
                    arguments=to_ijson(arguments if isinstance(arguments, dict) else {"value": arguments}),
                    started_at=parse_ts(entry.ts, now), finished_at=parse_ts(entry.ts, now),
                    status=Step.Status.OK, declaration_source="none", reversibility=Step.Reversibility.UNKNOWN,
                    effect_summary=f"ChronoMCP {entry.kind}"[:500],
                ))
        Step.objects.bulk_create(steps)
        _recount(run, steps)
        sign_checkpoint(run=run, now=now)
        run.save()
    return run

