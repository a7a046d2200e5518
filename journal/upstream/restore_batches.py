"""PostgreSQL statements that put many like rows back at once (`restore`): rows the agent inserted,
deleted, or updated in the same fields, each still only where the database finds it as expected. The
images go in as JSON arrays read back into the table's own types (`jsonb_populate_recordset`), paired by
their position."""

from ..undo.database import capture
from ..undo.database.rows import INSERTED, Change
from .captured import dumps


def _set(table: str, alias: str) -> str:
    return (f"(SELECT * FROM jsonb_populate_recordset(NULL::{capture.qualified(table)}, %s::jsonb) "
            f"WITH ORDINALITY) {alias}")


def statement(group: list[Change], key: tuple[str, ...], expected: list[dict | None]) -> tuple[str, list]:
    """One statement for a run of like rows (see `restore._runs`); its row count is the rows put back."""
    first, q = group[0], capture.quoted
    table = capture.qualified(first.table)
    keyed = " AND ".join(f"t.{q(k)} = a.{q(k)}" for k in key)
    if expected[0] is None:  # rows that are not there: inserted again as they were before
        where = " AND ".join(f"t.{q(k)} = b.{q(k)}" for k in key)
        columns = ", ".join(q(c) for c in first.before)
        return (f"INSERT INTO {table} ({columns}) SELECT {', '.join(f'b.{q(c)}' for c in first.before)} "
                f"FROM {_set(first.table, 'b')} WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE {where})",
                [dumps([c.before for c in group])])
    if first.op == INSERTED:  # rows the agent inserted, deleted where they read as it left them
        same = " AND ".join(f"t.{q(c)} IS NOT DISTINCT FROM a.{q(c)}" for c in expected[0])
        return (f"DELETE FROM {table} t USING {_set(first.table, 'a')} WHERE {keyed} AND {same}",
                [dumps(expected)])
    fields = first.fields
    same = " AND ".join(f"t.{q(c)} IS NOT DISTINCT FROM a.{q(c)}" for c in fields)
    sets = ", ".join(f"{q(c)} = b.{q(c)}" for c in fields)
    return (f"UPDATE {table} t SET {sets} FROM {_set(first.table, 'b')} JOIN {_set(first.table, 'a')} "
            f"ON a.ordinality = b.ordinality WHERE {keyed} AND {same}",
            [dumps([c.before for c in group]), dumps(expected)])
