"""A call's write window on a database: while an agent's writing SQL is in flight, no other call the
Recorder sends writes to that database (in this process, a lock; across processes, an advisory lock on
PostgreSQL and a file lock beside an SQLite file), so the rows the capture keeps between the window's
opening and its closing are that call's, and the window says which are not (another role's on PostgreSQL,
a table the call could not touch on SQLite) and whether that leaves them exact. The rows are read in
batches and hashed as they come, so a statement of any size is read in memory bounded by what is kept."""

import fcntl
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..undo.database import capture
from ..undo.database.places import POSTGRESQL, dialect_of, sqlite_path
from ..undo.database.reading import plural
from . import captured, database

ADVISORY_KEY = 4_615_313_070_240_905_539  # the capture's advisory lock (any fixed 64-bit number)
_LOCAL: dict[str, Any] = {}
_LOCAL_GUARD = threading.Lock()
# Connections kept between windows, per database and process (every SQL call has a window, reads included,
# so a connection made for each would cost a read more than it takes): taken by one window at a time.
_KEPT: dict[tuple[int, str], list] = {}
KEPT_EACH = 4
PG_OPEN = (f"SELECT pg_advisory_lock(%s), (SELECT coalesce(max(id), 0) FROM {capture.CHANGES}), "
           f"(SELECT coalesce(array_agg(role::text), '{{}}') FROM {capture.CAPTURE_SCHEMA}.agents)")


@dataclass
class Window:
    place: str
    dialect: str
    head: int = 0
    held: Any = None  # the file descriptor or connection that holds the cross-process lock
    connection: Any = None  # the connection the capture is read on (PostgreSQL: the one holding the lock)
    local: Any = None  # this process's lock on the database (a threading.Lock)
    roles: list[str] = field(default_factory=list)  # PostgreSQL: the agent's roles, as the capture names them
    on_release: Any = None  # called once the window is let go (the caller's own lock on the database)
    released: bool = False
    spoiled: bool = False  # its connection failed: closed, not kept


def _local(place: str):
    with _LOCAL_GUARD:
        return _LOCAL.setdefault(place, threading.Lock())


def _file(place: str) -> int | None:
    """An SQLite file's identity (its inode): a connection kept to a file since replaced is not used."""
    if dialect_of(place) == POSTGRESQL:
        return None
    try:
        return os.stat(sqlite_path(place)).st_ino
    except OSError:
        return None


def _take(place: str):
    """A kept connection to `place` (made in this process, to the same file), or a new one."""
    now = _file(place)
    with _LOCAL_GUARD:
        kept = _KEPT.get((os.getpid(), place)) or []
        while kept:
            connection, file = kept.pop()
            if file == now:
                return connection
            connection.raw.close()
    return database.connect(place, timeout=3600, shared=True)


def _give(place: str, connection) -> None:
    with _LOCAL_GUARD:
        kept = _KEPT.setdefault((os.getpid(), place), [])
        if len(kept) < KEPT_EACH:
            kept.append((connection, _file(place)))
            return
    connection.raw.close()


def opened(place: str) -> Window:
    """Wait for the database's window, then read where its capture stands."""
    window = Window(place=place, dialect=dialect_of(place), local=_local(place))
    window.local.acquire()
    try:
        if window.dialect == POSTGRESQL:
            _open_postgresql(window)
        else:
            fd = os.open(f"{sqlite_path(place)}.undo-lock", os.O_CREAT | os.O_RDWR, 0o600)
            window.held = fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            window.connection = _take(place)
            window.head = database.head(window.connection)
    except BaseException:
        window.spoiled = True
        _release(window)
        raise
    return window


def _open_postgresql(window: Window) -> None:
    """The lock, the capture's last change id and the agent's roles, in one round trip on a kept connection
    (a kept one that fails is replaced once by a new one); a capture without its tables, in three."""
    for attempt in (1, 2):
        window.held = window.connection = _take(window.place)
        try:
            _, window.head, window.roles = window.held.rows(PG_OPEN, (ADVISORY_KEY,))[0]
            return
        except psycopg.errors.UndefinedTable:
            break  # no capture (yet): the lock is not taken by an aborted statement, take it alone
        except psycopg.Error:
            window.held.raw.close()
            window.held = window.connection = None
            if attempt == 2:
                raise
    window.held.rows("SELECT pg_advisory_lock(%s)", (ADVISORY_KEY,))
    window.head = database.head(window.held)
    named = _optional(window.held, f"SELECT role FROM {capture.CAPTURE_SCHEMA}.agents")
    window.roles = [role for (role,) in named]


def _optional(connection, sql: str) -> list[tuple]:
    try:
        return connection.rows(sql)
    except Exception:  # an older capture without the table: no roles named
        return []


def release(window: Window | None) -> None:
    """Let the window go without reading it (a call the agent cancelled)."""
    if window is not None:
        _release(window)


def _release(window: Window) -> None:
    """Let the window go, once: its cross-process lock (its connection kept for the next window), this
    process's lock, then the caller's."""
    if window.released:
        return
    window.released = True
    try:
        if isinstance(window.held, int):
            os.close(window.held)  # closing the descriptor releases the file lock
        if window.connection is not None:
            _hand_back(window)
    finally:
        window.held = window.connection = None
        if window.local is not None:
            window.local.release()
        if window.on_release is not None:
            window.on_release()


def _hand_back(window: Window) -> None:
    """The window's connection, its advisory lock let go, kept for the next; closed when it failed (ending
    the session releases the advisory lock)."""
    connection = window.connection
    if not window.spoiled:
        try:
            if window.dialect == POSTGRESQL:
                connection.rows("SELECT pg_advisory_unlock(%s)", (ADVISORY_KEY,))
            _give(window.place, connection)
            return
        except (psycopg.Error, sqlite3.Error):
            pass
    try:
        connection.raw.close()
    except (psycopg.Error, sqlite3.Error):
        pass


def closed(window: Window, *, tables: list[str] | None, keep: int, settle: float = 0,
           texts: Sequence[str] = ()) -> dict[str, Any]:
    """The rows the capture kept since the window opened, then the window released: the call's rows
    (at most `keep` of them kept; all of them counted and hashed), and `problem` when they cannot be told
    apart from another writer's. `tables`: those the call may write (on SQLite, rows of any other are
    another writer's), or None when every row in the window is the call's. `settle`: the call failed
    without an answer (it timed out) and its statement may still be running: the window is held until the
    database says no agent's statement is (at most `settle` seconds), so its rows land in it; `texts`, the
    call's statements as the record has them, tell its own session among those still running then."""
    try:
        still, running = ("", []) if not settle else _settled(window, settle, texts)
        found = _read(window, tables=tables, keep=keep)
        if still:
            found["problem"] = still
        if running:
            found["running"] = running
        return found
    except (database.DatabaseUnreachable, psycopg.Error, sqlite3.Error) as exc:
        window.spoiled = True
        why = exc if isinstance(exc, database.DatabaseUnreachable) else database.words_of(exc)
        return {"problem": f"the rows it changed could not be read from the capture: {why}",
                "from": window.head}
    finally:
        _release(window)


# The agents' sessions running a statement now, with their transaction's id once it has one (it has written):
# 32 bits, as pg_stat_activity gives it; the capture keeps the whole `xid8`, whose low 32 bits it is.
PG_BUSY = """
SELECT pid, backend_xid::text::bigint, left(query, 2000) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND (usename = ANY(%s) OR cardinality(%s::text[]) = 0 AND usename <> current_user)
  AND coalesce(state, 'unknown') NOT IN ('idle')
ORDER BY pid
"""


def _settled(window: Window, seconds: float, texts: Sequence[str]) -> tuple[str, list[dict]]:
    """Wait until no agent's statement is running on the database (PostgreSQL: no session of the agents'
    roles active, as pg_stat_activity shows it to the Recorder's role; SQLite: no writer holds the file), at
    most `seconds`; why the rows may not be all the call's when it still is, and (PostgreSQL) the sessions
    still running then, `{"pid", "xid", "ours"}` each (`xid` None before it has written; `ours` when the
    statement it runs is one of the call's `texts`): the capture's sweep attaches what the call's own
    transaction commits later to this step (`journal.upstream.unrecorded`)."""
    deadline = time.monotonic() + seconds
    running: list = []
    while time.monotonic() < deadline:
        if window.dialect == POSTGRESQL:
            running = window.connection.rows(PG_BUSY, (window.roles, window.roles))
        else:
            running = [] if _writable(window.connection) else [None]
        if not running:
            return "", []
        time.sleep(0.2)
    sessions = [{"pid": pid, "xid": xid, "ours": _running_one_of(query, texts)}
                for pid, xid, query in running] if window.dialect == POSTGRESQL else []
    return (f"its statement was still running {seconds:.0f} s after the call failed, so what it changed "
            "after is not in this step's undo (the capture's sweep says so here, or shows it as changed by "
            "no recorded call)"), sessions


def _squeezed(text: str) -> str:
    return " ".join((text or "").split()).rstrip(";").rstrip()


def _running_one_of(query: str | None, texts: Sequence[str]) -> bool:
    """Whether a session's statement (pg_stat_activity's `query`) is one of the call's: the text the server
    sent whole, or one statement of it (the record keeps each statement's first 300 characters)."""
    running = _squeezed(query or "")
    return bool(running) and any(
        (mine := _squeezed(text)) and (running.startswith(mine[:250]) or mine in running) for text in texts)


def _writable(connection) -> bool:
    """Whether SQLite lets a writer in now (the failed call's statement holds the file while it runs)."""
    connection.raw.execute("PRAGMA busy_timeout = 200")
    try:
        connection.raw.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return False
    finally:
        connection.raw.execute("PRAGMA busy_timeout = 3600000")  # as the window's connection was made
    connection.raw.execute("ROLLBACK")
    return True


def _read(window: Window, *, tables: list[str] | None, keep: int) -> dict[str, Any]:
    postgresql = window.dialect == POSTGRESQL
    mark = "%s" if postgresql else "?"
    kept, counts, others, writers, last, digest = [], {}, {}, set(), window.head, hashlib.sha256()
    sql = (f"SELECT {captured.columns(window.dialect)} FROM {captured.changes_table(window.dialect)} "
           f"WHERE id > {mark} ORDER BY id")
    connection = window.connection
    if database.head(connection) == window.head:  # nothing kept since it opened (most calls: reads)
        return {"from": window.head, "to": window.head, "count": 0, "tables": {},
                "sha256": digest.hexdigest(), "rows": []}
    with captured.snapshot(connection):
        replacing = _Replacing(connection) if not postgresql else None
        for raw in captured.streamed(connection, sql, [window.head]):
            last, table, op = raw[0], raw[1], raw[2]
            who = raw[6] if postgresql else None
            if not _the_calls(window, table, who, tables):
                other = who or table
                others[other] = others.get(other, 0) + 1
                continue
            if replacing is not None and replacing.heard(table, op, raw[3], raw[5]):
                continue  # a marker, not a row
            writers.add(who)
            digest.update(captured.line_of(raw))
            per = counts.setdefault(table, {"I": 0, "U": 0, "D": 0})
            per[op] += 1
            if len(kept) < keep:
                kept.append(captured.row_of(window.dialect, raw))
    total = sum(sum(per.values()) for per in counts.values())
    found = {"from": window.head, "to": last, "count": total, "tables": counts, "sha256": digest.hexdigest()}
    found["rows"] = kept if total <= keep else None
    if total > keep:
        found["inCapture"] = True  # over the bound kept in the record: the rows stay in the capture
        if window.dialect == POSTGRESQL:  # and are read again there by their range and writer
            found["who"] = sorted(writers)
    problem = _mixed(window, writers, others) or (replacing.problem() if replacing is not None else "")
    if problem:
        found["problem"] = problem
    if others:
        found["others"] = others
    return found


class _Replacing:
    """SQLite's hidden deletes in a call's rows: a row the capture marked just before SQLite replaced it
    (`capture.sqlite_table`'s 'R'), then inserted again under its key, or another row updated onto its key.
    A marker that no such write follows was an insert ignored or made an update (OR IGNORE, an upsert)."""

    def __init__(self, connection):
        self.keys = {table: json.loads(key) for table, key in _optional(
            connection, f"SELECT tbl, key FROM {capture.SQLITE_TABLES}")}
        self.marked: set[tuple[str, str]] = set()
        self.replaced: dict[str, int] = {}

    def heard(self, table: str, op: str, key: str, after: str | None) -> bool:
        """Take in one captured row; True when it is a marker (not one of the call's rows)."""
        if op == "R":
            self.marked.add((table, _same(key)))
            return True
        if not self.marked:
            return False
        landed = _same(key)
        if op == "U" and after and self.keys.get(table):
            image = json.loads(after)
            landed = _same(json.dumps([image.get(column) for column in self.keys[table]]))
            if landed == _same(key):
                return False  # an upsert's update of the row itself
        if op in ("I", "U") and (table, landed) in self.marked:
            self.marked.discard((table, landed))
            self.replaced[table] = self.replaced.get(table, 0) + 1
        return False

    def problem(self) -> str:
        if not self.replaced:
            return ""
        said = "; ".join(f"{plural(n, 'row')} of {table}" for table, n in self.replaced.items())
        return (f"it replaced rows whose keys it wrote again ({said}): SQLite deleted them without telling "
                "the triggers, so the undo cannot be worked out from the rows the capture kept")


def _same(key: str) -> str:
    """A captured key in one spelling (SQLite's json_array and Python's json differ in spaces)."""
    return json.dumps(json.loads(key), sort_keys=True, separators=(",", ":"))


def _the_calls(window: Window, table: str, who: str | None, tables: list[str] | None) -> bool:
    if window.dialect == POSTGRESQL:
        return not window.roles or who in window.roles
    return tables is None or table in tables or f"main.{table}" in tables


def _mixed(window: Window, writers: set, others: dict) -> str:
    """Why the rows cannot be told apart from another writer's, or ""."""
    if window.dialect == POSTGRESQL:
        if len(writers) > 1:
            return ("rows by more than one role changed while the call ran, and the capture does not name "
                    "the agent's role (manage.py capture NAME --agent-role ROLE), so the call's rows cannot "
                    "be told apart from the others'")
        return ""
    if others:
        return (f"another writer changed {', '.join(sorted(others))} while the call ran, so the call's own "
                "rows cannot be told apart from theirs with certainty")
    return ""
