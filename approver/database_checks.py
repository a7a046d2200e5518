"""A database undo's check (journal.undo.database): every row the call changed, read now through the
Recorder's own connection and judged row by row (`rows.judge`): as the agent left it (it will be put back),
as before the call (already undone), or changed since in a field the agent changed (a conflict, shown field
by field, before / agent / now). Where a later call of the same plan changed the row again, its undo comes
first, so the row is judged as that undo will leave it. The rows come a batch at a time, from the run's
record or, for a statement over the bound the record keeps, from the database's capture (proved first to be
the rows the record signed), so a check holds a batch in memory whatever the statement's size. An adapter:
it reads, and writes nothing."""

from typing import Any

from journal.undo.database.rows import CONFLICT, RESTORE, SAMPLE, UNDONE, Tally, judge
from journal.upstream import database, restore
from journal.upstream.captured import CallRows, NotInCapture, chained_rows, snapshot
from journal.upstream.snapshots import KeptRows

from . import answers, kept_tables

SHOWN_CONFLICTS = 1000  # conflicting rows kept field by field (and whole, for an overwrite) in what is signed
SHOWN_KEPT = 20
READ_SECONDS = 600  # a check's reads of a big statement's rows, at most


def kept_of(earlier: dict[str, Any] | None) -> list[dict] | None:
    """The tables the Recorder kept before a step's approved destruction (`journal.upstream.snapshots`)."""
    kept = ((earlier or {}).get("database") or {}).get("kept")
    return kept if isinstance(kept, list) and kept else None


def rows_of(earlier: dict[str, Any] | None) -> tuple[CallRows | KeptRows | None, str]:
    """The rows a step's record says its call changed (or, for an approved destruction, the tables kept
    before it), or None and why they cannot be had."""
    if kept := kept_of(earlier):
        return KeptRows(kept), ""
    rows = CallRows.of(earlier)
    if rows is None:
        return None, "the record keeps no rows for it"
    if why := rows.problem():
        return None, why
    return rows, ""


def in_capture_words(rows: CallRows) -> str:
    return (f"Its {rows.count:,} changed rows are over what the run's record keeps: the undo reads them from "
            "the database's capture, which keeps them until the undo window closes; the record keeps their "
            "count and digest, checked before anything is done.")


def check(*, place: str, earlier: dict[str, Any] | None, chained: list[CallRows] | None = None
          ) -> tuple[str, dict[str, Any]]:
    """(status, detail) as a check result: ok, conflict, error or unavailable. `chained`: the rows of the
    plan's undos that run before this one, the one run last first."""
    rows, why = rows_of(earlier)
    if rows is None:
        return "error", {"failureClass": "unknown",
                         "message": answers.bounded(f"Its rows cannot be checked: {why}.")}
    if not place:
        return "unavailable", {"message": "No database is registered for its server any more."}
    if isinstance(rows, KeptRows):
        return kept_tables.check(place, list(rows.snapshots.values()))
    try:
        with database.connected(place, timeout=READ_SECONDS) as connection, snapshot(connection):
            rows.verify(connection)
            judged = _Judging()
            keys = database.keys(connection)
            for batch in rows.batches(connection):
                now = restore.rows_now(connection, batch, keys)
                before_later = chained_rows(chained or [], connection, batch)
                judged.add(batch, now, before_later)
    except NotInCapture as exc:
        return "error", {"failureClass": "unknown", "message": answers.bounded(
            f"Its rows cannot be checked: {exc}. Nothing can be undone for it without them.")}
    except database.DatabaseUnreachable as exc:
        return "unavailable", {"message": answers.bounded(str(exc))}
    detail = judged.detail()
    if rows.in_capture:
        detail["inCapture"] = in_capture_words(rows)
    counts = detail["rows"]
    if counts[CONFLICT]:
        detail["message"] = answers.bounded(
            f"{counts[CONFLICT]:,} of its rows changed since the agent's call in a field the agent changed.")
        detail["overwritable"] = counts[CONFLICT] <= SHOWN_CONFLICTS
        return "conflict", detail
    if not counts[RESTORE]:
        return "error", {"failureClass": "business_rule",
                         "message": "Already undone: every row it changed reads as it did before the call."}
    return "ok", detail


class _Judging:
    """The check as the plan shows and signs it, a batch at a time: what the undo would do, every
    conflicting row field by field (and whole, for an overwrite), the rows whose other fields changed since
    (kept), a sample."""

    def __init__(self) -> None:
        self.tally = Tally()
        self.counts = {RESTORE: 0, UNDONE: 0, CONFLICT: 0}
        self.conflicts: list[dict] = []
        self.kept: list[dict] = []
        self.sample: list[dict] = []
        self.chained = False

    def add(self, batch: list, now: dict[str, Any], before_later: dict[str, Any]) -> None:
        judged = []
        for change in batch:
            identity = change.identity()
            self.chained = self.chained or identity in before_later
            current = before_later[identity] if identity in before_later else now[identity]
            one = judge(change, current)
            judged.append(one)
            self.counts[one.state] += 1
            if one.state == CONFLICT and len(self.conflicts) < SHOWN_CONFLICTS:
                self.conflicts.append({**one.as_detail(now[identity]), "now": now[identity]})
            elif one.state == RESTORE and one.kept and len(self.kept) < SHOWN_KEPT:
                self.kept.append(one.as_detail(now[identity]))
            if one.state == RESTORE and len(self.sample) < SAMPLE:
                self.sample.append({"table": change.table, "key": change.key, "op": change.op,
                                    "before": change.before, "agent": change.after})
        self.tally.add(judged)

    def detail(self) -> dict[str, Any]:
        said = self.tally.summary()
        detail = {"wouldDo": answers.bounded(f"{said['words'][:1].upper()}{said['words'][1:]}"),
                  "rows": dict(self.counts), "tables": said["tables"], "conflicts": self.conflicts,
                  "kept": self.kept, "sample": self.sample}
        if self.chained:
            detail["chained"] = "once the undos of the plan's later changes to the same rows have run"
        return detail
