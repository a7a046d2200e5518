"""A table kept before a person's approved `DROP TABLE`, `TRUNCATE` or whole-table `DELETE` is sent
(journal.undo.database): its definition (SQLite's own text for the table, its indexes and triggers; on
PostgreSQL the columns, defaults, identity and serial sequences, constraints, indexes and triggers, each as
the catalogue writes it) and a copy of its rows where the agent cannot reach them (the capture's schema on
PostgreSQL; a `_undo_capture_snap…` table on SQLite, which every statement of an agent's that names it is
refused). The undo re-creates the table from that definition when it is gone and reloads the rows when it is
empty, in one transaction with a marker, through the Recorder's own connection."""

import json
import secrets
from collections.abc import Mapping
from typing import Any

from ..undo.database import capture
from ..undo.database.places import POSTGRESQL
from ..undo.database.reading import CAPTURE_SCHEMA, CAPTURE_TRIGGER, SQLITE_PREFIX
from . import database, restore, windows
from .restore import SqliteTransaction, applied, mark_applied

DROP, EMPTY = "drop", "empty"

PG_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
       a.attidentity, a.attgenerated
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""
PG_CONSTRAINTS = """
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'c', 'x', 'f') ORDER BY contype = 'f', conname
"""
PG_INDEXES = """
SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = %s::regclass
AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid)
"""
PG_TRIGGERS = """
SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal
AND tgname <> %s
"""
PG_OWNER = """
SELECT pg_get_userbyid(c.relowner), (SELECT array_agg(ARRAY[CASE WHEN a.grantee = 0 THEN NULL
                                                               ELSE pg_get_userbyid(a.grantee) END,
                                                          a.privilege_type])
                                     FROM aclexplode(c.relacl) a)
FROM pg_class c WHERE c.oid = %s::regclass
"""
PG_SEQUENCES = """
SELECT quote_ident(n.nspname) || '.' || quote_ident(s.relname), a.attname, d.deptype
FROM pg_depend d JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_namespace n ON n.oid = s.relnamespace
JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.refobjid = %s::regclass AND d.deptype IN ('a', 'i')
"""


def keepable(statements: list[Mapping], captured: set[str]) -> list[dict] | None:
    """The tables an approved call destroys that a snapshot can keep ([{"table", "how"}]), or None when any
    of its destruction is of another kind (a drop of something else, a CASCADE, an ALTER…): then nothing is
    kept, and the step stays one that cannot be undone."""
    kept: dict[str, str] = {}
    for statement in statements:
        verb, destroys = statement.get("verb", ""), statement.get("destroys") or []
        if statement.get("kind") == "destroy":
            if not destroys or "CASCADE" in verb:
                return None
            if verb.startswith("drops table"):
                how = DROP
            elif "(TRUNCATE)" in verb:
                how = EMPTY
            else:
                return None
        elif statement.get("kind") == "rows":
            if not statement.get("wholeTable") or all(t in captured or t.split(".", 1)[-1] in captured
                                                      for t in destroys):
                return None  # rows the capture keeps, beside a destruction: not one undo or the other
            how = EMPTY  # every row of a table the capture does not keep
        else:
            continue
        for table in destroys:
            kept.setdefault(table, how)
    return [{"table": table, "how": how} for table, how in kept.items()] or None


def keepable_of(found: Mapping) -> list[dict] | None:
    """The tables a call's statements (as read before it, `earlier_state["database"]`) destroy that a
    snapshot can keep, or None."""
    reading = found.get("reading") or {}
    if reading.get("kind") not in ("destroy", "rows"):
        return None
    captured = set((found.get("catalog") or {}).get("captured") or ())
    return keepable(reading.get("statements") or [], captured)


def take(place: str, wanted: list[Mapping]) -> list[dict[str, Any]]:
    """Keep each table of `wanted` (definition and rows) in one transaction; what was kept, per table."""
    with database.connected(place, timeout=3600) as connection:
        pg = connection.dialect == POSTGRESQL
        every = database.keys(connection)
        captured = database.captured(connection)
        kept = []
        begin = connection.raw.transaction() if pg else SqliteTransaction(connection)
        with begin:
            for want in wanted:
                name = database.canonical_name(every, want["table"], connection.dialect) or want["table"]
                copy = (f"{CAPTURE_SCHEMA}.snap_{secrets.token_hex(6)}" if pg
                        else f"{SQLITE_PREFIX}_snap_{secrets.token_hex(6)}")
                definition, columns = (_pg_definition if pg else _sqlite_definition)(connection, name)
                connection.raw.execute(f"CREATE TABLE {capture.qualified(copy)} AS SELECT * FROM "
                                       f"{capture.qualified(name)}")
                rows = connection.rows(f"SELECT count(*) FROM {capture.qualified(copy)}")[0][0]
                kept.append({"table": name, "how": want["how"], "copy": copy, "rows": rows,
                             "definition": definition, "columns": columns, "key": list(every.get(name) or ()),
                             "captured": name in captured})
    return kept


def _sqlite_definition(connection: database.Connection, table: str) -> tuple[list[str], list[str]]:
    """SQLite's own text for the table, then its indexes and triggers (not the capture's)."""
    found = connection.rows("SELECT name, sql FROM sqlite_master WHERE tbl_name = ? AND sql IS NOT NULL "
                            "ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 ELSE 2 END, rowid",
                            (table,))
    definition = [sql for name, sql in found if not name.startswith(SQLITE_PREFIX)]
    xinfo = connection.rows(f"PRAGMA table_xinfo({capture.quoted(table)})")
    columns = [row[1] for row in xinfo if row[-1] == 0]  # not the generated ones
    return definition, columns


def _pg_definition(connection: database.Connection, table: str) -> tuple[list[str], list[str]]:
    """The statements that re-create the table as the catalogue describes it, and the columns its rows
    reload into (not the generated ones)."""
    q, name = capture.quoted, capture.qualified(table)
    sequences = connection.rows(PG_SEQUENCES, (name,))
    serial = [(seq, column) for seq, column, kind in sequences if kind == "a"]
    lines, columns = [], []
    for column, kind, not_null, default, identity, generated in connection.rows(PG_COLUMNS, (name,)):
        line = f"{q(column)} {kind}"
        if generated == "s":
            line += f" GENERATED ALWAYS AS ({default}) STORED"
        else:
            columns.append(column)
            if identity:
                line += f" GENERATED {'ALWAYS' if identity == 'a' else 'BY DEFAULT'} AS IDENTITY"
            elif default is not None:
                line += f" DEFAULT {default}"
        lines.append(line + (" NOT NULL" if not_null else ""))
    statements = [f"CREATE SEQUENCE IF NOT EXISTS {seq}" for seq, _ in serial]
    statements.append(f"CREATE TABLE {name} ({', '.join(lines)})")
    statements += [f"ALTER TABLE {name} ADD CONSTRAINT {q(c)} {d}" for c, d in connection.rows(PG_CONSTRAINTS,
                                                                                          (name,))]
    statements += [sql for (sql,) in connection.rows(PG_INDEXES, (name,))]
    statements += [sql for (sql,) in connection.rows(PG_TRIGGERS, (name, CAPTURE_TRIGGER))]
    statements += [f"ALTER SEQUENCE {seq} OWNED BY {name}.{q(column)}" for seq, column in serial]
    owner, grants = connection.rows(PG_OWNER, (name,))[0]
    statements.append(f"ALTER TABLE {name} OWNER TO {q(owner)}")  # its owned sequences go with it
    statements += [f"GRANT {privilege} ON {name} TO {'PUBLIC' if grantee is None else q(grantee)}"
                   for grantee, privilege in grants or () if grantee != owner]
    for seq, _column, _kind in sequences:
        last, called = connection.rows(f"SELECT last_value, is_called FROM {seq}")[0]
        statements.append(f"SELECT setval('{seq}', {int(last)}, {'true' if called else 'false'})")
    return statements, columns


def forget(place: str, copies: list[str]) -> int:
    """Drop the kept copies named (their undo window closed): how many rows they held."""
    held = 0
    with database.connected(place, timeout=600) as connection:
        for copy in copies:
            if not copy.startswith((f"{CAPTURE_SCHEMA}.snap_", f"{SQLITE_PREFIX}_snap_")):
                continue  # only ever the capture's own copies
            try:
                held += connection.rows(f"SELECT count(*) FROM {capture.qualified(copy)}")[0][0]
            except Exception:  # noqa: BLE001 - already gone
                continue
            connection.raw.execute(f"DROP TABLE IF EXISTS {capture.qualified(copy)}")
    return held


def destroyed(place: str, kept: list[Mapping]) -> list[str]:
    """Of the tables kept before a call, those it did destroy (dropped, or emptied, as it said it would);
    the copies of the others, which nothing will need, are dropped."""
    with database.connected(place) as connection:
        done = [k["table"] for k in kept
                if state(connection, k)[0] == ("gone" if k["how"] == DROP else "empty")]
    if spare := [k["copy"] for k in kept if k["table"] not in done]:
        forget(place, spare)
    return done


# -- the check and the undo ------------------------------------------------------------------------------


def state(connection: database.Connection, kept: Mapping) -> tuple[str, int]:
    """How a kept table reads now: ("gone", 0), ("empty", 0) or ("rows", how many)."""
    if kept["table"] not in database.keys(connection):
        return "gone", 0
    count = connection.rows(f"SELECT count(*) FROM {capture.qualified(kept['table'])}")[0][0]
    return ("empty", 0) if not count else ("rows", count)


def copy_rows(connection: database.Connection, kept: Mapping) -> int | None:
    """How many rows the kept copy holds now (None: the copy is gone)."""
    try:
        return connection.rows(f"SELECT count(*) FROM {capture.qualified(kept['copy'])}")[0][0]
    except Exception:  # noqa: BLE001 - the copy was dropped: the undo cannot run
        return None


def put_back(place: str, snapshots: list[Mapping], *, marker: str) -> dict[str, Any]:
    """Re-create each dropped table, and reload each table that is empty, from what was kept, latest first,
    in one transaction with `marker` (a second run changes nothing: `"again": True`). A table that reads
    otherwise than its undo expects (re-created, or holding rows since) is left as it is, and counted."""
    window = windows.opened(place)
    try:
        with database.connected(place, timeout=3600) as connection:
            pg = connection.dialect == POSTGRESQL
            begin = connection.raw.transaction() if pg else SqliteTransaction(connection)
            with begin:
                if (done := applied(connection, marker)) is not None:
                    return {**done, "again": True}
                detail = {"tables": {}, "restored": 0, "changedSince": 0, "left": 0}
                for kept in reversed(snapshots):
                    detail["tables"][kept["table"]] = one = _put_back_one(connection, kept)
                    detail["restored"] += one["restored"]
                    detail["changedSince"] += one["changedSince"]
                mark_applied(connection, marker, detail)
            return detail
    finally:
        windows.release(window)


def _put_back_one(connection: database.Connection, kept: Mapping) -> dict[str, Any]:
    now, _ = state(connection, kept)
    expected = "gone" if kept["how"] == DROP else "empty"
    if now != expected and not (kept["how"] == DROP and now == "empty"):
        return {"restored": 0, "changedSince": kept["rows"], "recreated": False, "left": now}
    recreated = False
    if now == "gone":
        for sql in kept["definition"]:
            connection.raw.execute(sql)
        if kept.get("captured") and kept.get("key"):
            _recapture(connection, kept)
        recreated = True
    names = ", ".join(capture.quoted(c) for c in kept["columns"])
    overriding = " OVERRIDING SYSTEM VALUE" if connection.dialect == POSTGRESQL else ""
    restored = connection.raw.execute(
        f"INSERT INTO {capture.qualified(kept['table'])} ({names}){overriding} SELECT {names} FROM "
        f"{capture.qualified(kept['copy'])}").rowcount
    return {"restored": restored, "changedSince": 0, "recreated": recreated}


def _recapture(connection: database.Connection, kept: Mapping) -> None:
    """The re-created table captured again, as it was."""
    if connection.dialect == POSTGRESQL:
        connection.raw.execute(capture.postgresql_table(kept["table"], kept["key"]))
        return
    columns = [row[1] for row in connection.rows(f"PRAGMA table_info({capture.quoted(kept['table'])})")]
    for statement in capture.sqlite_table(kept["table"], kept["key"], columns).split(";\n"):
        if statement.strip():
            connection.raw.execute(statement)



class KeptRows:
    """The rows of a step whose tables were kept before it ran, as a plan's chain reads them: how the step's
    undo leaves a row (as the kept copy holds it; None where the copy has no row with its key)."""

    def __init__(self, snapshots: list[Mapping]):
        self.snapshots = {kept["table"]: kept for kept in snapshots}

    def firsts(self, connection: database.Connection, changes: list) -> dict[str, dict | None]:
        found: dict[str, dict | None] = {}
        for table, kept in self.snapshots.items():
            mine = [c for c in changes if c.table in (table, table.split(".", 1)[-1])]
            if not mine or not kept.get("key"):
                continue
            key = tuple(kept["key"])
            rows = {tuple(json.dumps(row.get(k)) for k in key): row
                    for row in restore.read_rows(connection, kept["copy"], key, [c.key for c in mine])}
            found.update({c.identity(): rows.get(tuple(json.dumps(v) for v in c.key)) for c in mine})
        return found
