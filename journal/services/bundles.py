"""The run record as a whole: verify a run's chain, export it as a bundle, import a ChronoMCP audit log (all
or nothing, after verifying it); another Recorder's bundle is imported by `imports`."""

import json
from collections.abc import Iterator
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import ports
from ..models import RecorderKey, Run, Step, Team
from ..record import chain, keys
from ..record.bundle import ImportRefused, parse_chronomcp_log, parse_ts
from ..record.canonical import to_ijson
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


def export_bundle(*, run: Run, entries: bool = True) -> dict[str, Any]:
    """The run's record as a self-contained bundle; signs the head first so the whole chain is covered. The
    run header is the chain's first entry (runs recorded before headers were signed have none: theirs is
    rebuilt from the run, and another Recorder will refuse it). Without `entries`, all the rest."""
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
        **({"entries": list(_wire(run.entries.order_by("seq")))} if entries else {}),
        "checkpoints": [
            checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")
        ],
        "publicKeys": [key.as_wire() for key in RecorderKey.objects.filter(origin=origin)],
        "approvals": ports.signed_decisions(run),  # the approval side owns them; an imported run has none
    }


def write_bundle(*, run: Run, out: IO[str]) -> int:
    """Write the run's bundle (`export_bundle`) to `out` as it is read, entries last and one per line, so a
    run of any length is exported in memory bounded by one chunk of entries, and an importer reads the
    members that vouch for the entries before the entries themselves. The number of entries written."""
    bundle = export_bundle(run=run, entries=False)
    out.write("{\n")
    for name, value in bundle.items():
        out.write(f"{json.dumps(name)}: {json.dumps(value, ensure_ascii=False)},\n")
    out.write('"entries": [')
    written = 0
    for entry in _wire(run.entries.order_by("seq")):
        out.write(("\n" if not written else ",\n") + json.dumps(entry, ensure_ascii=False))
        written += 1
    out.write("\n]}\n")
    return written


def _recount(run: Run, steps: list) -> None:
    """The run list's counters of an imported run, from its steps' status and reversibility."""
    run.step_count = len(steps)
    for step in steps:
        count(run, step, acted=step.status == Step.Status.OK)
    run.state = Run.State.IMPORTED


def import_chronomcp_log(*, text: str, source: str, team: Team | None = None) -> Run:
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
        run = open_run(agent=None, key=key, now=now, started_at=first_ts, label="chronomcp", team=team)
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

