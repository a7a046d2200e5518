"""The Recorder's own door to a database server's database (journal.undo.database): with its own
credentials, never through the agent's tool server. Before an agent's SQL is sent, what the database says
about the tables it names (keys, which are captured, how many rows a destroying statement would take) and
where the capture stands; putting the capture in place; and the rows a call changed, after it. One error
type, `DatabaseUnreachable`, whose message says what went wrong in words. Synchronous: callers on the event
loop run it in a thread."""

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg

from ..undo.database import capture, judging, postgres, resolving, splitting, sqlite
from ..undo.database import reading as readings
from ..undo.database.judging import Catalog
from ..undo.database.places import (
    POSTGRESQL,
    NotADatabase,
    dialect_of,
    postgresql_url,
    shown_database,
    sqlite_path,
)
from ..undo.database.reading import CAPTURE_SCHEMA, CAPTURE_TRIGGER, SQLITE_PREFIX, Reading
from . import catalogue, reach

TIMEOUT_SECONDS = 5  # a connection, and each statement the Recorder runs before a call
# Each SQLite database's schema, copied in memory once per schema version (SQLite's `schema_version` moves
# with every change of it): what the SQL is compiled against.
_COPIES: dict[str, tuple] = {}
_COPIES_GUARD = threading.Lock()


class DatabaseUnreachable(Exception):
    """The database could not be reached or read: the message says which and why, in words."""


@dataclass
class Connection:
    dialect: str
    raw: object  # a psycopg or sqlite3 connection
    place: str = ""

    def rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        cursor = self.raw.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


def connect(place: str, *, timeout: float = TIMEOUT_SECONDS, shared: bool = False) -> Connection:
    """A connection to `place` (autocommit on PostgreSQL, with a statement timeout); the caller closes it.
    `shared`: an SQLite connection used from one thread at a time, but not always the same one."""
    try:
        dialect = dialect_of(place)
    except NotADatabase as exc:
        raise DatabaseUnreachable(str(exc)) from None
    try:
        if dialect == POSTGRESQL:
            raw = psycopg.connect(postgresql_url(place), autocommit=True,
                                  connect_timeout=max(1, int(min(timeout, TIMEOUT_SECONDS))),
                                  options=f"-c statement_timeout={int(timeout * 1000)}")
        else:
            raw = sqlite3.connect(f"file:{sqlite_path(place)}?mode=rw", uri=True, timeout=timeout,
                                  isolation_level=None, check_same_thread=not shared)
    except (psycopg.Error, sqlite3.Error) as exc:
        raise DatabaseUnreachable(f"{shown_database(place)} cannot be reached: {words_of(exc)}") from None
    return Connection(dialect, raw, place)


@contextlib.contextmanager
def connected(place: str, *, timeout: float = TIMEOUT_SECONDS) -> Iterator[Connection]:
    """A connection to `place`, closed at the end; the database's errors as DatabaseUnreachable."""
    connection = connect(place, timeout=timeout)
    try:
        yield connection
    except (psycopg.Error, sqlite3.Error) as exc:
        raise DatabaseUnreachable(
            f"{shown_database(place)} answered with an error: {words_of(exc)}") from None
    finally:
        connection.raw.close()


def words_of(exc: Exception) -> str:
    """A database error's first line, as a person reads it."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


# -- what the database says about its tables ----------------------------------------------------------------

PG_TABLES = """
SELECT n.nspname, c.relname, pg_table_is_visible(c.oid) AS visible,
       coalesce(array_agg(a.attname ORDER BY array_position(i.indkey::int2[], a.attnum))
                FILTER (WHERE a.attname IS NOT NULL), '{}')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey)
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema', %s)
  AND n.nspname NOT LIKE 'pg_toast%%'
GROUP BY c.oid, n.nspname, c.relname
"""
PG_CAPTURED = """
SELECT n.nspname, c.relname, pg_table_is_visible(c.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.tgname = %s AND t.tgenabled = 'O'
"""


def keys(connection: Connection) -> dict[str, tuple[str, ...]]:
    """Every table, by every name the SQL may use for it, with its primary key's columns (() for none)."""
    found: dict[str, tuple[str, ...]] = {}
    if connection.dialect == POSTGRESQL:
        for schema, table, visible, key in connection.rows(PG_TABLES, (CAPTURE_SCHEMA,)):
            found[f"{schema}.{table}"] = tuple(key)
            if visible:
                found.setdefault(table, tuple(key))
        return found
    for (table,) in connection.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                                    "'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE ?", (f"{SQLITE_PREFIX}%",)):
        columns = connection.rows(f"PRAGMA table_info({capture.quoted(table)})")
        key = tuple(name for _, name, *_, pk in sorted(columns, key=lambda c: c[-1]) if pk)
        found[table] = found[f"main.{table}"] = key
    return found


def captured(connection: Connection) -> frozenset[str]:
    """The tables whose changes the capture keeps now (their triggers there, switched on, and on SQLite,
    written for the table's columns as they are)."""
    if connection.dialect == POSTGRESQL:
        names = set()
        for schema, table, visible in connection.rows(PG_CAPTURED, (CAPTURE_TRIGGER,)):
            names.add(f"{schema}.{table}")
            if visible:
                names.add(table)
        return frozenset(names)
    if not connection.rows("SELECT 1 FROM sqlite_master WHERE name = ?", (capture.SQLITE_TABLES,)):
        return frozenset()
    triggers = {name for (name,) in connection.rows("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    names = set()
    for table, columns in connection.rows(f"SELECT tbl, columns FROM {capture.SQLITE_TABLES}"):
        now = [row[1] for row in connection.rows(f"PRAGMA table_info({capture.quoted(table)})")]
        if now == json.loads(columns) and all(capture.trigger_name(table, op) in triggers for op in "iud"):
            names.update((table, f"main.{table}"))
    return frozenset(names)


def counts(connection: Connection, tables: Sequence[str]) -> dict[str, int]:
    """How many rows each table holds now (the tables a statement would drop or empty); a table that does
    not exist, or whose count takes longer than the timeout, is left out."""
    found = {}
    for table in tables:
        try:
            found[table] = connection.rows(f"SELECT count(*) FROM {capture.qualified(table)}")[0][0]
        except (psycopg.Error, sqlite3.Error):
            continue
    return found


def head(connection: Connection) -> int:
    """The capture's last change id now (0 when there is no capture): a call's rows come after it. Any
    other failure is raised: a head taken as 0 would make every row ever kept the call's."""
    table = capture.CHANGES if connection.dialect == POSTGRESQL else capture.SQLITE_CHANGES
    try:
        return int(connection.rows(f"SELECT coalesce(max(id), 0) FROM {table}")[0][0])
    except (psycopg.errors.UndefinedTable, sqlite3.OperationalError) as exc:
        if isinstance(exc, sqlite3.OperationalError) and "no such table" not in str(exc):
            raise
        return 0


def read_statements(connection: Connection, text: str, *, split: str = splitting.DATABASE,
                    keeps_connection: bool = False, listed_safe: Sequence[str] = ()) -> Reading:
    """`text` read by its database's grammar, with what the database's catalogue knows, as its server will
    run it (`readings.as_run`): cut as the server cuts it (`split`), and on a server that keeps its connection
    between calls (`keeps_connection`); `listed_safe`: the functions an admin listed as changing nothing."""
    problem = splitting.disagreement(text, split=split, dialect=connection.dialect)
    return readings.as_run(_read(connection, text, listed_safe), keeps_connection=keeps_connection,
                           split_problem=problem)


def _read(connection: Connection, text: str, safe_listed: Sequence[str] = ()) -> Reading:
    if connection.dialect == POSTGRESQL:
        functions, relations = postgres.names_in(text)
        selects = resolving.selects(text)
        # Each SELECT, and what each row change evaluates, is resolved by PostgreSQL itself (what it calls
        # by any means, its domains); a text that names nothing else needs the catalogue for nothing.
        used = catalogue.users_objects_used(connection, selects, safe_listed) if selects else None
        if not functions and not relations and not used:
            return postgres.read(text, safe=())
        every = set().union(*used.values()) if used is not None else None
        return postgres.read(text, safe=catalogue.safe_functions(connection, functions, safe_listed, every),
                             hidden=used or {},
                             views=catalogue.unsafe_views(connection, relations, safe_listed))
    place = connection.place
    try:  # a file put in another's place is another database, whatever its schema version says
        version = (os.stat(sqlite_path(place)).st_ino, connection.rows("PRAGMA schema_version")[0][0])
    except OSError:
        version = None
    with _COPIES_GUARD:
        cached = _COPIES.get(place)
    if cached is None or version is None or cached[0] != version:
        schema = [sql for (sql,) in connection.rows(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY CASE type WHEN 'table' THEN 0 "
            "WHEN 'index' THEN 1 WHEN 'view' THEN 2 ELSE 3 END, rowid")]
        cached = (version, sqlite.Copy(schema, shared=True), threading.Lock())
        with _COPIES_GUARD:
            _COPIES[place] = cached
    with cached[2]:  # one reading at a time on a copy
        return sqlite.read(text, copy=cached[1])


def reached(connection: Connection, reading: Reading, listed: Sequence[str] = ()) -> dict[str, tuple]:
    """What the text's row changes reach beyond their own tables (PostgreSQL; SQLite's compiling hears it),
    the functions met on the way judged by the catalogue (`safe_functions`, with those an admin listed)."""
    if connection.dialect != POSTGRESQL or reading.kind != "rows":
        return {}
    written = [s for s in reading.statements if s.kind == "rows"]
    verbs = {"inserts": "INSERT", "updates": "UPDATE", "deletes": "DELETE"}
    events = {verbs.get(part.split(" ", 1)[0]) for s in written for part in s.verb.split("; ")}
    return reach.reaches(connection, [t for s in written for t in s.writes],
                         events=reach.EVERY if None in events else frozenset(events), listed=listed,
                         unsafe=lambda functions: [f for f in functions if f not in catalogue.safe_functions(
                             connection, functions, listed)])


def reached_uncaptured(connection: Connection, table: str, captured_now: frozenset[str]) -> list[str]:
    """What deleting or updating rows of `table` reaches (foreign keys' actions, triggers) that the capture
    does not keep, in words: "public.orders (ON DELETE CASCADE)"."""
    if connection.dialect == POSTGRESQL:
        found = reach.reaches(connection, [table]).get(table, ())
        return list(dict.fromkeys(f"{reached} ({how})" if reached else how for reached, _, how in found
                                  if not reached or reached not in captured_now))
    quoted_ = capture.quoted(table)
    missing = []
    for text in (f"DELETE FROM {quoted_}", f"UPDATE {quoted_} SET rowid = rowid"):
        for statement in _read(connection, text).statements:
            missing += [f"{t} (through a trigger or a foreign key)" for t in (*statement.writes,
                                                                             *statement.triggers)
                        if t != table and t not in captured_now]
    return list(dict.fromkeys(missing))


def before_call(place: str, text: str, *, split: str = splitting.DATABASE, keeps_connection: bool = False,
                listed_safe: Sequence[str] = ()) -> dict:
    """What the step keeps of the database just before an agent's SQL is sent (`earlier_state`): the
    statements in words, what the database said of their tables, the undo that follows, and where the
    capture stands; `problem` instead when the database could not be read (then the call's undo is
    unknown, and the policies hold it)."""
    try:
        with connected(place) as connection:
            catalogue.as_the_agent(connection)
            reading = read_statements(connection, text, split=split, keeps_connection=keeps_connection,
                                      listed_safe=listed_safe)
            catalog = Catalog(keys=keys(connection), captured=captured(connection),
                              counts=counts(connection, judging.to_count(reading)),
                              reaches=reached(connection, reading, listed_safe))
            declaration = judging.declare(reading, catalog)
            at = head(connection) if reading.kind == "rows" else None
    except DatabaseUnreachable as exc:
        return {"database": {"problem": f"its database could not be read before the call: {exc}"}}
    state = {"dialect": reading.dialect, "reading": reading.as_record(), "catalog": catalog.as_record(),
             "undo": declaration.model_dump(mode="json", exclude_none=True)}
    if at is not None:
        state["head"] = at
    return {"database": state}


# -- putting the capture in place ---------------------------------------------------------------------------


class CannotCapture(Exception):
    """A table the capture cannot keep (it does not exist, or has no primary key): the message says which."""


def canonical_name(every: dict[str, tuple[str, ...]], name: str, dialect: str) -> str | None:
    """The name the capture keeps a table under: `schema.table` on PostgreSQL, the bare name on SQLite."""
    if name not in every:
        return None
    if dialect != POSTGRESQL:
        return name.removeprefix("main.")
    if "." in name:
        return name
    same = (q for q in every if "." in q and q.split(".", 1)[1] == name and every[q] == every[name])
    return next(same, name)


def _chosen(connection: Connection, tables: Sequence[str] | None) -> dict[str, tuple[str, ...]]:
    """{table: key columns} for `tables`, or for every table with a primary key (None)."""
    every = keys(connection)
    if tables is None:
        return {name: key for name, key in every.items() if key and (
            "." in name if connection.dialect == POSTGRESQL else not name.startswith("main."))}
    chosen, problems = {}, []
    for name in tables:
        canonical = canonical_name(every, name, connection.dialect)
        if canonical is None:
            problems.append(f"there is no table {name}")
        elif not every[canonical]:
            problems.append(f"{name} has no primary key, so its rows cannot be told apart")
        else:
            chosen[canonical] = every[canonical]
    if problems:
        raise CannotCapture("; ".join(problems))
    return chosen


def capture_sql(place: str, tables: Sequence[str] | None, *, agent_roles: Sequence[str] = (),
                guard: bool = True) -> tuple[str, list[str]]:
    """The SQL that puts the capture in place on `tables` (None: every table with a primary key), and the
    tables it captures. CannotCapture names a table it cannot keep."""
    with connected(place) as connection:
        chosen = _chosen(connection, tables)
        if connection.dialect == POSTGRESQL:
            recorder = connection.rows("SELECT current_user")[0][0]
            return capture.postgresql(chosen, recorder=recorder, agent_roles=agent_roles,
                                      guard=guard), sorted(chosen)
        columns = {table: [row[1] for row in connection.rows(f"PRAGMA table_info({capture.quoted(table)})")]
                   for table in chosen}
        return capture.sqlite({t: (key, columns[t]) for t, key in chosen.items()}), sorted(chosen)


def install(place: str, tables: Sequence[str] | None, *,
            agent_roles: Sequence[str] = ()) -> tuple[list[str], str]:
    """Put the capture in place, in one transaction: the tables captured, and a note when the database's
    own guard could not be installed (it needs a superuser)."""
    sql, chosen = capture_sql(place, tables, agent_roles=agent_roles)
    note = ""
    with connected(place, timeout=60) as connection:
        if connection.dialect == POSTGRESQL:
            superuser = connection.rows("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0][0]
            if not superuser:
                sql = capture_sql(place, tables, agent_roles=agent_roles, guard=False)[0]
                note = ("The guard that stops anyone dropping or switching off a capture trigger was not "
                        "installed: it needs a superuser. The Recorder still refuses every statement of an "
                        "agent's that touches the capture; a superuser can run `manage.py capture --sql` for "
                        "it.")
            with connection.raw.transaction():
                connection.raw.execute(sql)
        else:
            connection.raw.executescript(f"BEGIN IMMEDIATE;\n{sql}\nCOMMIT;")
    return chosen, note
