"""A database undo's check (journal.undo.database): every row the call changed, read now through the
Recorder's own connection and judged row by row (`rows.judge`): as the agent left it (it will be put back),
as before the call (already undone), or changed since in a field the agent changed (a conflict, shown field
by field, before / agent / now). Where a later call of the same plan changed the row again, its undo comes
first, so the row is judged as that undo will leave it. An adapter: it reads, and writes nothing."""

from typing import Any

from journal.undo.database import judging
from journal.undo.database.rows import CONFLICT, RESTORE, SAMPLE, UNDONE, Change, judge, net, summary
from journal.upstream import database, restore

from . import answers

SHOWN_CONFLICTS = 1000  # conflicting rows kept field by field (and whole, for an overwrite) in what is signed
SHOWN_KEPT = 20


def changes_of(earlier: dict[str, Any] | None) -> tuple[list[Change] | None, str]:
    """The net row changes a step's record keeps, or None and why they cannot be had."""
    found = judging.database_rows((earlier or {}).get("left")) or {}
    if found.get("problem"):
        return None, found["problem"]
    if found.get("rows") is None:
        return None, ("its rows are over the bound the record keeps, and are read from the capture at undo "
                      "time")
    return net(found["rows"]), ""


def check(*, place: str, earlier: dict[str, Any] | None, chained: dict[str, dict | None] | None = None
          ) -> tuple[str, dict[str, Any]]:
    """(status, detail) as a check result: ok, conflict, error or unavailable."""
    changes, why = changes_of(earlier)
    if changes is None:
        return "error", {"failureClass": "unknown",
                         "message": answers.bounded(f"Its rows cannot be checked: {why}.")}
    if not place:
        return "unavailable", {"message": "No database is registered for its server any more."}
    try:
        with database.connected(place) as connection:
            now = restore.rows_now(connection, changes, database.keys(connection))
    except database.DatabaseUnreachable as exc:
        return "unavailable", {"message": answers.bounded(str(exc))}
    chained = chained or {}
    judged = [judge(c, chained[c.identity()] if c.identity() in chained else now[c.identity()])
              for c in changes]
    counts = {state: sum(1 for j in judged if j.state == state) for state in (RESTORE, UNDONE, CONFLICT)}
    detail = _detail(judged, now, counts)
    if any(c.identity() in chained for c in changes):
        detail["chained"] = "once the undos of the plan's later changes to the same rows have run"
    if counts[CONFLICT]:
        detail["message"] = answers.bounded(
            f"{counts[CONFLICT]:,} of its rows changed since the agent's call in a field the agent changed.")
        detail["overwritable"] = counts[CONFLICT] <= SHOWN_CONFLICTS
        return "conflict", detail
    if not counts[RESTORE]:
        return "error", {"failureClass": "business_rule",
                         "message": "Already undone: every row it changed reads as it did before the call."}
    return "ok", detail


def _detail(judged: list, now: dict[str, Any], counts: dict[str, int]) -> dict[str, Any]:
    """The check as the plan shows and signs it: what the undo would do, every conflicting row field by
    field (and whole, for an overwrite), the rows whose other fields changed since (kept), a sample."""
    said = summary(judged)
    return {"wouldDo": answers.bounded(f"{said['words'][:1].upper()}{said['words'][1:]}"), "rows": counts,
            "tables": said["tables"],
            "conflicts": [{**j.as_detail(now[j.change.identity()]), "now": now[j.change.identity()]}
                          for j in judged if j.state == CONFLICT][:SHOWN_CONFLICTS],
            "kept": [j.as_detail(now[j.change.identity()]) for j in judged
                     if j.state == RESTORE and j.kept][:SHOWN_KEPT],
            "sample": [{"table": j.change.table, "key": j.change.key, "op": j.change.op,
                        "before": j.change.before, "agent": j.change.after}
                       for j in judged if j.state == RESTORE][:SAMPLE]}
