"""A database undo, through the Recorder's own connection (journal.undo.database): the rows a call changed
read as they are now, and put back in one transaction, each row only where the database still finds it as
the agent left it (or as the approvers saw it, for a row they chose to overwrite), with a marker written in
the same transaction so an undo that ran is never run again, whatever is killed when."""

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..undo.database import capture
from ..undo.database.places import POSTGRESQL
from ..undo.database.rows import INSERTED, UPDATED, Change
from . import database, windows
from . import restore_batches as batches
from .captured import CallRows, dumps, loads

BATCH = 500


def _pg_image(table: str) -> str:
    return f"jsonb_populate_record(NULL::{capture.qualified(table)}, %s::jsonb)"


def rows_now(connection: database.Connection, changes: list[Change],
             key_columns: Mapping[str, tuple[str, ...]]) -> dict[str, dict | None]:
    """Each changed row as it reads now ({identity: row, or None where there is no row with its key}),
    written as the capture writes rows, so the two compare as they are."""
    found: dict[tuple, dict | None] = {}
    by_table: dict[str, list[Change]] = {}
    for change in changes:
        by_table.setdefault(change.table, []).append(change)
    for table, group in by_table.items():
        key = key_columns.get(table)
        if key is None:  # the table is gone (dropped since, or by a later call the plan undoes first)
            continue
        for start in range(0, len(group), BATCH):
            batch = group[start:start + BATCH]
            for row in read_rows(connection, table, key, [_now_key(c, key) for c in batch]):
                found[_identity(table, [row.get(k) for k in key])] = row
    return {c.identity(): found.get(_identity_now(c, key_columns[c.table])) if c.table in key_columns
            else None for c in changes}


def _now_key(change: Change, key: tuple[str, ...]) -> list:
    """Where the row is now: its key as the agent left it (an update may have changed the key itself)."""
    image = change.after or change.before
    return [image.get(k) for k in key]


def _identity(table: str, values: list) -> tuple:
    """Where a row is, to look it up (a key's values as they compare: a BLOB's {"$blob": hex} as its text)."""
    return (table, *(json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v for v in values))


def _identity_now(change: Change, key: tuple[str, ...]) -> tuple:
    return _identity(change.table, _now_key(change, key))


def read_rows(connection: database.Connection, table: str, key: tuple[str, ...],
          keys: list[list]) -> Iterable[dict]:
    if connection.dialect == POSTGRESQL:
        keyed = dumps([dict(zip(key, values, strict=True)) for values in keys])
        using = ", ".join(capture.quoted(k) for k in key)
        sql = (f"SELECT to_jsonb(t)::text FROM {capture.qualified(table)} t JOIN "
               f"jsonb_populate_recordset(NULL::{capture.qualified(table)}, %s::jsonb) k USING ({using})")
        return [loads(row) for (row,) in connection.rows(sql, (keyed,))]
    columns = [row[1] for row in connection.rows(f"PRAGMA table_info({capture.quoted(table)})")]
    marks = ", ".join("(" + ", ".join("?" for _ in key) + ")" for _ in keys)
    where = "(" + ", ".join(capture.quoted(k) for k in key) + ")"
    sql = (f"SELECT {capture.sqlite_image('t', columns)} FROM {capture.quoted(table)} AS t "
           f"WHERE {where} IN (VALUES {marks})")
    params = [_sqlite(v) for values in keys for v in values]
    return [loads(row) for (row,) in connection.rows(sql, params)]


def _sqlite(value: Any) -> Any:
    """A captured value as SQLite takes it back: a {"$blob": hex} as bytes."""
    if isinstance(value, dict) and set(value) == {"$blob"}:
        return bytes.fromhex(value["$blob"])
    return value


# -- putting rows back ---------------------------------------------------------------------------------------


def _statement(connection: database.Connection, change: Change, key: tuple[str, ...], expected: dict | None
               ) -> tuple[str, list]:
    """The one conditional statement that puts `change`'s row back where the row reads as `expected` (as the
    agent left it, or as the approvers saw it) in the fields that matter: a row that is not there is
    inserted as it was before; a row the agent inserted is deleted; any other is updated back."""
    if expected is None:
        return _insert(connection, change, key)
    if change.op == INSERTED:
        return _delete(connection, change.table, key, expected)
    fields = change.fields if change.op == UPDATED else list(change.before)
    checked = change.fields if change.op == UPDATED else list(expected)
    return _update(connection, change, key, expected, fields=fields, checked=checked)


def _insert(connection: database.Connection, change: Change, key: tuple[str, ...]) -> tuple[str, list]:
    table, q = capture.qualified(change.table), capture.quoted
    if connection.dialect == POSTGRESQL:
        where = " AND ".join(f"t.{q(k)} = b.{q(k)}" for k in key)
        return (f"INSERT INTO {table} SELECT b.* FROM {_pg_image(change.table)} b WHERE NOT EXISTS "
                f"(SELECT 1 FROM {table} t WHERE {where})", [dumps(change.before)])
    columns = tuple(change.before)
    return (_sqlite_insert(change.table, key, columns),
            [*(_sqlite(change.before[c]) for c in columns), *(_sqlite(change.before[k]) for k in key)])


@functools.lru_cache(maxsize=256)
def _sqlite_insert(table_name: str, key: tuple[str, ...], columns: tuple[str, ...]) -> str:
    table, q = capture.qualified(table_name), capture.quoted
    return (f"INSERT INTO {table} ({', '.join(q(c) for c in columns)}) "
            f"SELECT {', '.join('?' for _ in columns)} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE {' AND '.join(f'{q(k)} IS ?' for k in key)})")


def _delete(connection: database.Connection, table_name: str, key: tuple[str, ...], expected: dict
            ) -> tuple[str, list]:
    table, q = capture.qualified(table_name), capture.quoted
    if connection.dialect == POSTGRESQL:
        conditions = " AND ".join([*(f"t.{q(k)} = a.{q(k)}" for k in key),
                                   *(f"t.{q(c)} IS NOT DISTINCT FROM a.{q(c)}" for c in expected)])
        sql = f"DELETE FROM {table} t USING {_pg_image(table_name)} a WHERE {conditions}"
        return sql, [dumps(expected)]
    return _sqlite_delete(table_name, tuple(expected)), [_sqlite(v) for v in expected.values()]


@functools.lru_cache(maxsize=256)
def _sqlite_delete(table_name: str, columns: tuple[str, ...]) -> str:
    conditions = " AND ".join(f"{capture.quoted(c)} IS ?" for c in columns)
    return f"DELETE FROM {capture.qualified(table_name)} WHERE {conditions}"


def _update(connection: database.Connection, change: Change, key: tuple[str, ...], expected: dict, *,
            fields: list[str], checked: list[str]) -> tuple[str, list]:
    table, q = capture.qualified(change.table), capture.quoted
    if connection.dialect == POSTGRESQL:
        image = _pg_image(change.table)
        conditions = " AND ".join([*(f"t.{q(k)} = a.{q(k)}" for k in key),
                                   *(f"t.{q(c)} IS NOT DISTINCT FROM a.{q(c)}" for c in checked)])
        sets = ", ".join(f"{q(c)} = b.{q(c)}" for c in fields)
        return (f"UPDATE {table} t SET {sets} FROM {image} b, {image} a WHERE {conditions}",
                [dumps(change.before), dumps(expected)])
    return (_sqlite_update(change.table, key, tuple(fields), tuple(checked)),
            [*(_sqlite(change.before.get(c)) for c in fields), *(_sqlite(expected.get(k)) for k in key),
             *(_sqlite(expected.get(c)) for c in checked)])


@functools.lru_cache(maxsize=256)
def _sqlite_update(table_name: str, key: tuple[str, ...], fields: tuple[str, ...], checked: tuple[str, ...]
                   ) -> str:
    q = capture.quoted
    conditions = " AND ".join([*(f"{q(k)} IS ?" for k in key), *(f"{q(c)} IS ?" for c in checked)])
    sets = ", ".join(f"{q(c)} = ?" for c in fields)
    return f"UPDATE {capture.qualified(table_name)} SET {sets} WHERE {conditions}"


def applied(connection: database.Connection, marker: str) -> dict | None:
    """What an undo that already ran did (its marker's detail), or None."""
    table = capture.APPLIED if connection.dialect == POSTGRESQL else capture.SQLITE_APPLIED
    mark = "%s" if connection.dialect == POSTGRESQL else "?"
    found = connection.rows(f"SELECT detail FROM {table} WHERE marker = {mark}", (marker,))
    if not found:
        return None
    detail = found[0][0]
    return detail if isinstance(detail, dict) else json.loads(detail)


def put_back(place: str, rows: CallRows, *, marker: str, overrides: Mapping[str, dict | None],
             leave: set[str]) -> dict[str, Any]:
    """Put a call's rows (`rows`) back in one transaction, latest change first, a batch at a time, each row
    only where it reads as the agent left it, or as the approvers saw it (`overrides`: {identity: that row,
    None for no row}, for rows they chose to overwrite); `leave`: rows left alone as signed. The counts,
    kept under `marker` in the same transaction: a second run finds them and changes nothing (`"again":
    True`). Raises NotInCapture, changing nothing, when the capture no longer holds the rows the record
    signed."""
    window = windows.opened(place)  # no agent's call writes the database while its rows go back
    try:
        with database.connected(place, timeout=3600) as connection:
            return _transaction(connection, rows, marker=marker, overrides=overrides, leave=leave)
    finally:
        windows.release(window)


def _transaction(connection: database.Connection, rows: CallRows, *, marker: str,
                 overrides: Mapping[str, dict | None], leave: set[str]) -> dict[str, Any]:
    pg = connection.dialect == POSTGRESQL
    keys = database.keys(connection)
    counts: dict[str, dict[str, int]] = {}
    begin = connection.raw.transaction() if pg else SqliteTransaction(connection)
    with begin:
        if (done := applied(connection, marker)) is not None:
            return {**done, "again": True}
        if pg:
            connection.raw.execute(capture.RESTORING)
        rows.verify(connection)
        for batch in rows.batches(connection):
            expected = {c.identity(): overrides.get(c.identity(), c.after) for c in batch}
            for group in _runs(batch, expected, leave):
                first = group[0]
                per = counts.setdefault(first.table, {"restored": 0, "changedSince": 0, "left": 0,
                                                      "byOp": {"I": 0, "U": 0, "D": 0}})
                if first.identity() in leave:
                    per["left"] += len(group)
                    continue
                key = keys.get(first.table) or keys.get(first.table.split(".", 1)[-1]) or ()
                done_rows = _apply(connection, group, key, expected)
                per["restored"] += done_rows
                per["changedSince"] += len(group) - done_rows
                per["byOp"][first.op] += done_rows
        detail = {"tables": counts, "restored": sum(c["restored"] for c in counts.values()),
                  "changedSince": sum(c["changedSince"] for c in counts.values()),
                  "left": sum(c["left"] for c in counts.values())}
        mark_applied(connection, marker, detail)
    return detail


def mark_applied(connection: database.Connection, marker: str, detail: dict) -> None:
    """The marker of an undo that ran, with what it did, written in the undo's own transaction."""
    pg = connection.dialect == POSTGRESQL
    table = capture.APPLIED if pg else capture.SQLITE_APPLIED
    mark = "%s" if pg else "?"
    connection.raw.execute(f"INSERT INTO {table} (marker, detail) VALUES ({mark}, {mark})",
                           (marker, json.dumps(detail)))


def _kind(change: Change, expected: dict | None) -> tuple:
    """What a row's undo is, for putting like rows back together: where a statement fits many rows."""
    if expected is None:
        return change.table, "insert", tuple(change.before)
    if change.op == INSERTED:
        return change.table, "delete", tuple(expected)
    if change.op == UPDATED:
        return change.table, "update", tuple(change.fields)
    return change.table, "other", ()


def _runs(ordered: list[Change], expected: Mapping[str, dict | None], leave: set[str]):
    """Consecutive rows of the same kind, in order, up to BATCH each (one row each for a kind no one
    statement fits); rows left alone as signed come as runs of their own."""
    group: list[Change] = []
    last = None
    for change in ordered:
        kind = ("leave",) if change.identity() in leave else _kind(change, expected.get(change.identity()))
        if group and (kind != last or kind[1] == "other" or len(group) >= BATCH):
            yield group
            group = []
        group.append(change)
        last = kind
    if group:
        yield group


def _apply(connection: database.Connection, group: list[Change], key: tuple[str, ...],
           expected: Mapping[str, dict | None]) -> int:
    """Put a run of like rows back: how many the database still found as expected."""
    if len(group) == 1:
        sql, params = _statement(connection, group[0], key, expected.get(group[0].identity()))
        return connection.raw.execute(sql, params).rowcount
    if connection.dialect == POSTGRESQL:
        sql, params = batches.statement(group, key, [expected.get(c.identity()) for c in group])
        return connection.raw.execute(sql, params).rowcount
    # SQLite: like rows make the same statement, run for each row's values (rowcount adds them up)
    statements = [_statement(connection, c, key, expected.get(c.identity())) for c in group]
    return connection.raw.executemany(statements[0][0], [params for _, params in statements]).rowcount


class SqliteTransaction:
    """BEGIN IMMEDIATE … COMMIT on an autocommit sqlite3 connection, rolled back on any error."""

    def __init__(self, connection: database.Connection):
        self.raw = connection.raw

    def __enter__(self):
        self.raw.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, value, traceback):
        self.raw.execute("COMMIT" if kind is None else "ROLLBACK")
        return False

