"""A database call's rows as its check and its undo read them (journal.undo.database), in batches, latest
change first, whichever of two places holds them: the run's record (up to RECORDER_DATABASE_ROWS_KEPT rows)
or, past that bound, the database's capture itself, read again by the call's own range of change ids and
the same filter the Recorder read it with just after the call (`windows`). Rows read from the capture are
first proved to be the very rows the record signed (their count and digest), and each row's net change
over the call is worked out by the database (its first before, its last after), so no step holds more than
a batch of rows in memory, whatever the statement's size."""

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..undo.database import capture
from ..undo.database.judging import database_rows
from ..undo.database.places import POSTGRESQL
from ..undo.database.rows import Change, net
from . import database

BATCH = 2000


class NotInCapture(Exception):
    """The capture no longer holds the rows the record signed for a call: its undo cannot be worked out."""


def loads(text: str | None) -> Any:
    """A row image's JSON text, parsed (by orjson, or by the standard library for what orjson refuses, such
    as an integer past 64 bits)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(value: Any) -> str:
    """JSON text of row images for the database to read (orjson; the standard library for an integer past
    64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def row_of(dialect: str, raw: tuple) -> dict[str, Any]:
    """A captured change as the record keeps it, from its columns as text (`columns`)."""
    change_id, table, op, key, before, after, *rest = raw
    key, before, after = loads(key), loads(before), loads(after)
    extra = {"who": rest[0], "txid": rest[1]} if dialect == POSTGRESQL else {}
    return {"id": change_id, "table": table, "op": op, "key": key, "before": before, "after": after, **extra}


def line_of(raw: tuple) -> bytes:
    """A captured change's line in the digest of a call's rows: its columns as the database stores them (the
    JSON images as their text), one JSON array per row."""
    return dumps(raw).encode() + b"\n"


def columns(dialect: str) -> str:
    """A captured change's columns, each as text but its id."""
    if dialect == POSTGRESQL:
        return "id, tbl, op::text, pk::text, before::text, after::text, who::text, txid::text"
    return "id, tbl, op, pk, before, after"


def changes_table(dialect: str) -> str:
    return capture.CHANGES if dialect == POSTGRESQL else capture.SQLITE_CHANGES


@dataclass
class CallRows:
    """The rows a step's call changed (`found`: what the Recorder read of them just after the call)."""

    found: Mapping[str, Any]
    _net: dict[str, Change] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, earlier: Mapping | None) -> "CallRows | None":
        found = database_rows((earlier or {}).get("left"))
        return cls(found) if found is not None else None

    @property
    def in_capture(self) -> bool:
        return bool(self.found.get("inCapture")) and self.found.get("rows") is None

    @property
    def count(self) -> int:
        return int(self.found.get("count") or 0)

    def problem(self) -> str:
        """Why its rows cannot be had at all ("" when they can)."""
        if self.found.get("problem"):
            return self.found["problem"]
        if self.found.get("rows") is None and not self.found.get("inCapture"):
            return "the record keeps none of its rows"
        return ""

    def _changes(self) -> dict[str, Change]:
        if self._net is None:
            self._net = {c.identity(): c for c in net(self.found.get("rows") or ())}
        return self._net

    # -- reading -----------------------------------------------------------------------------------------

    def verify(self, connection: database.Connection) -> None:
        """Raise NotInCapture unless the capture still holds exactly the rows the record signed (rows kept in
        the record need nothing of it)."""
        if not self.in_capture:
            return
        where, params = self._where(connection.dialect)
        digest, count = hashlib.sha256(), 0
        sql = (f"SELECT {columns(connection.dialect)} FROM {changes_table(connection.dialect)} "
               f"WHERE {where} ORDER BY id")
        for raw in streamed(connection, sql, params):
            digest.update(line_of(raw))
            count += 1
        if count != self.count or digest.hexdigest() != self.found.get("sha256"):
            raise NotInCapture(
                f"the database's capture no longer holds the {self.count:,} rows the record signed for it "
                f"(it holds {count:,} in their range{', not the same ones' if count == self.count else ''})")

    def batches(self, connection: database.Connection, size: int = BATCH) -> Iterator[list[Change]]:
        """Its net row changes, latest change first, `size` at a time."""
        if not self.in_capture:
            ordered = sorted(self._changes().values(), key=lambda c: max(c.ids), reverse=True)
            for start in range(0, len(ordered), size):
                yield ordered[start:start + size]
            return
        sql, params = self._net_sql(connection.dialect)
        batch: list[Change] = []
        for raw in streamed(connection, sql, params):
            change = _change(connection.dialect, raw)
            if change is None:
                continue
            batch.append(change)
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    def firsts(self, connection: database.Connection, changes: list[Change]) -> dict[str, dict | None]:
        """For those of `changes`' rows this call changed too, each row as it was before this call
        ({identity: row, None for a row this call inserted}): how this call's undo leaves it."""
        if not self.in_capture:
            mine = self._changes()
            return {c.identity(): mine[c.identity()].before for c in changes if c.identity() in mine}
        keyed = dumps([[c.table, c.key] for c in changes])
        sql, params = self._net_sql(connection.dialect, keyed=keyed)
        found = {}
        for raw in streamed(connection, sql, params):
            change = _change(connection.dialect, raw)
            if change is not None:
                found[change.identity()] = change.before
        return found

    def _where(self, dialect: str) -> tuple[str, list]:
        """The call's rows in the capture: its range of change ids, and (PostgreSQL) the role that wrote them
        or (SQLite) the tables they are in."""
        if dialect == POSTGRESQL:
            return ("id > %s AND id <= %s AND who = ANY(%s)",
                    [self.found["from"], self.found["to"], list(self.found.get("who") or ())])
        tables = list(self.found.get("tables") or ())
        marks = ", ".join("?" for _ in tables) or "NULL"
        return (f"id > ? AND id <= ? AND tbl IN ({marks}) AND op <> 'R'",  # a replace's marker is no row
                [self.found["from"], self.found["to"], *tables])

    def _net_sql(self, dialect: str, *, keyed: str | None = None) -> tuple[str, list]:
        """Each row's net change over the call, worked out by the database: its first before and last
        after, ordered by its last change, latest first (only the rows `keyed` names, when given)."""
        where, params = self._where(dialect)
        table = changes_table(dialect)
        if keyed is not None:
            if dialect == POSTGRESQL:
                where += " AND (tbl, pk) IN (SELECT e->>0, e->1 FROM jsonb_array_elements(%s::jsonb) e)"
            else:
                where += (" AND (tbl, pk) IN (SELECT json_extract(value, '$[0]'), "
                          "json_extract(value, '$[1]') FROM json_each(?))")
            params.append(keyed)
        text = "::text" if dialect == POSTGRESQL else ""
        sql = (f"WITH g AS (SELECT tbl, pk, min(id) AS first, max(id) AS last FROM {table} WHERE {where} "
               f"GROUP BY tbl, pk) SELECT g.tbl, g.pk{text}, f.before{text}, l.after{text}, g.first, g.last "
               "FROM g "
               f"JOIN {table} f ON f.id = g.first JOIN {table} l ON l.id = g.last ORDER BY g.last DESC")
        return sql, params


def _change(dialect: str, raw: tuple) -> Change | None:
    """A row's net change from `_net_sql`, or None when the call left it as it found it."""
    table, key, before, after, first, last = raw
    key, before, after = loads(key), loads(before), loads(after)
    if before == after:  # inserted then deleted, or changed and changed back
        return None
    return Change(table, list(key), before, after, [first, last] if first != last else [first])


def streamed(connection: database.Connection, sql: str, params: list) -> Iterator[tuple]:
    """A query's rows, fetched a batch at a time (on PostgreSQL through a server-side cursor, so the client
    never holds the whole answer). On PostgreSQL the caller is in a transaction."""
    if connection.dialect == POSTGRESQL:
        cursor = connection.raw.cursor(name=f"undo_rows_{id(params)}")
    else:
        cursor = connection.raw.cursor()
    try:
        cursor.execute(sql, params)
        while batch := cursor.fetchmany(BATCH):
            yield from batch
    finally:
        cursor.close()


def chained_rows(sources: list["CallRows"], connection: database.Connection, changes: list[Change]
                 ) -> dict[str, dict | None]:
    """How the undos that run before this one leave `changes`' rows (`sources`: those undos' rows, the one
    run last first): {identity: the row before the plan's earliest later call that changed it}."""
    found: dict[str, dict | None] = {}
    left = list(changes)
    for source in sources:
        if not left:
            break
        firsts = source.firsts(connection, left)
        found.update(firsts)
        left = [c for c in left if c.identity() not in firsts]
    return found


@contextlib.contextmanager
def snapshot(connection: database.Connection) -> Iterator[None]:
    """One transaction to read in (the capture's rows, then the tables, as of one moment on PostgreSQL);
    rolled back, since a check writes nothing."""
    if connection.dialect == POSTGRESQL:
        with connection.raw.transaction(force_rollback=True):
            yield
        return
    connection.raw.execute("BEGIN")
    try:
        yield
    finally:
        connection.raw.execute("ROLLBACK")


def prune(place: str, *, upto: int, needed: list[tuple[int, int]]) -> int:
    """Forget the capture's rows up to change `upto` (the last the Recorder has read into a step) but those in
    `needed` ((from, to] ranges: rows of calls over the record's bound whose undo window is still open).
    How many rows were forgotten."""
    ranges = json.dumps([{"f": start, "t": end} for start, end in needed])
    with database.connected(place, timeout=600) as connection:
        if connection.dialect == POSTGRESQL:
            sql = (f"DELETE FROM {capture.CHANGES} c WHERE c.id <= %s AND NOT EXISTS (SELECT 1 FROM "
                   "jsonb_to_recordset(%s::jsonb) AS r(f bigint, t bigint) WHERE c.id > r.f AND c.id <= r.t)")
        else:
            table = capture.SQLITE_CHANGES  # json_each has an `id` of its own: the capture's is named
            sql = (f"DELETE FROM {table} WHERE {table}.id <= ? AND NOT EXISTS (SELECT 1 FROM json_each(?) r "
                   f"WHERE {table}.id > json_extract(r.value, '$.f') "
                   f"AND {table}.id <= json_extract(r.value, '$.t'))")
        return connection.raw.execute(sql, (upto, ranges)).rowcount
