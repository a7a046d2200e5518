"""The check of an approved destruction's undo (journal.upstream.snapshots): each table the Recorder kept
before the call, as it reads now against what its undo does. A dropped table must still be gone (or there
again, empty), an emptied one still empty, and the kept copy must hold every row it kept; a table someone
re-created or filled since is a conflict the undo leaves alone. An adapter: it reads, and writes nothing."""

from typing import Any

from journal.undo.database.judging import kept_words
from journal.undo.database.reading import plural
from journal.upstream import database, snapshots

from . import answers


def check(place: str, kept: list[dict]) -> tuple[str, dict[str, Any]]:
    """(status, detail) as a check result: ok, conflict, error or unavailable."""
    try:
        with database.connected(place, timeout=600) as connection:
            found = [(k, snapshots.state(connection, k), snapshots.copy_rows(connection, k)) for k in kept]
    except database.DatabaseUnreachable as exc:
        return "unavailable", {"message": answers.bounded(str(exc))}
    missing = ", ".join(k["table"] for k, _, copied in found if copied != k["rows"])
    if missing:
        return "error", {"failureClass": "unknown", "message": answers.bounded(
            f"The copy the Recorder kept of {missing} no longer holds the rows it kept, so it cannot be put "
            "back.")}
    would, since, restore = [], [], 0
    for k, (now, count), _ in found:
        if now == "gone" and k["how"] == snapshots.DROP:
            would.append(f"re-create table {k['table']} and reload its {plural(k['rows'], 'row')}")
        elif now == "empty":
            would.append(f"reload {plural(k['rows'], 'row')} into {k['table']}, empty now")
        else:
            since.append(f"{k['table']} was dropped since" if now == "gone"
                         else f"{k['table']} holds {plural(count, 'row')} since")
            continue
        restore += k["rows"]
    said = "; ".join(would)
    detail = {"wouldDo": answers.bounded(said[:1].upper() + said[1:]),
              "rows": {"restore": restore, "undone": 0, "conflict": len(since)}, "conflicts": [], "kept": [],
              "sample": [], "keptTables": {k["table"]: kept_words(k) for k in kept}}
    if since:
        detail["message"] = answers.bounded(
            "Changed since the agent's call: " + "; ".join(since) + ". Its undo leaves the table as it is.")
        detail["overwritable"] = False
        return "conflict", detail
    return "ok", detail
