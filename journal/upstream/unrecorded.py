"""Rows the capture kept that no recorded call's window holds: changes made to a captured table while no
call of the Recorder's was in flight (a transaction an agent's server committed later, a tool that writes
outside the Recorder, anyone with the agent's credentials). The capture sees every writer; the windows say
which rows were calls'. What is left is never dropped silently: the sweep finds it before the prune may
forget it, and the server's page, the metrics and the log say so. On PostgreSQL only the rows of the agents'
roles count (another role's rows are another writer's, as inside a window); on SQLite, which has no roles,
every such row does. Synchronous, on the Recorder's own connection."""

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..undo.database import capture
from ..undo.database.places import POSTGRESQL
from . import captured, database


@dataclass
class Swept:
    """What one sweep read: up to which change id, and the rows outside every window."""

    upto: int
    rows: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    first: int = 0
    last: int = 0
    since: str = ""
    until: str = ""
    roles: list[str] = field(default_factory=list)
    horizon: dict = field(default_factory=dict)  # PostgreSQL: for the next sweep (`sweep`)
    # Rows a call's own transaction committed after its window closed, by the call (`late`'s values).
    attached: dict[Any, "Late"] = field(default_factory=dict)
    # Of the rows found, those written by a session still running when a call gave up (`sessions`).
    probably: dict[Any, int] = field(default_factory=dict)

    def as_record(self, now: str) -> dict:
        return {"found": now, "rows": self.rows, "tables": dict(sorted(self.tables.items())),
                "from": self.first, "to": self.last, "since": self.since, "until": self.until,
                **({"roles": sorted(self.roles)} if self.roles else {}),
                **({"probably": [{"step": key, "rows": n} for key, n in self.probably.items()]}
                   if self.probably else {})}


@dataclass
class Late:
    """What one call's transaction committed after its window closed: proven the call's by the transaction
    id (`xid`, the one the call's session had when its window closed, as the capture keeps it)."""

    xid: int
    rows: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    first: int = 0
    last: int = 0

    def as_record(self) -> dict:
        return {"xid": self.xid, "rows": self.rows, "tables": dict(sorted(self.tables.items())),
                "from": self.first, "to": self.last}


def windows_of(ranges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The calls' windows, (from, to] each, merged and sorted for lookups."""
    merged: list[list[int]] = []
    for start, end in sorted((int(f), int(t)) for f, t in ranges if t is not None and f is not None):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [m[0] for m in merged], [m[1] for m in merged]


def covered(starts: list[int], ends: list[int], change: int) -> bool:
    index = bisect.bisect_left(starts, change) - 1
    return index >= 0 and starts[index] < change <= ends[index]


PG_HORIZON = (f"SELECT (SELECT last_value FROM {capture.CHANGES}_id_seq), "
              "pg_snapshot_xmax(pg_current_snapshot())::text::bigint, "
              "pg_snapshot_xmin(pg_current_snapshot())::text::bigint")


def sweep(place: str, *, after: int, ranges: Sequence[tuple[int, int]], lag_seconds: int,
          horizon: dict | None = None, late: Mapping[int, Any] | None = None,
          sessions: Mapping[int, Any] | None = None) -> Swept:
    """The capture's rows after change `after`, read against the calls' windows (`ranges`): the sweep goes
    past every row a window holds and every other writer's, and stops at the first row outside every window
    that is younger than `lag_seconds` (its call may still be in flight, its window not yet recorded). On
    PostgreSQL a change id is taken when its row is written and may be committed much later, so a sweep
    goes no further than the last id handed out at the sweep before (`horizon`) once every transaction then
    running has ended; it leaves the horizon for the next in `Swept.horizon`.

    PostgreSQL: `late` maps the transaction id (its low 32 bits, as pg_stat_activity shows it) of a call
    whose statement was still running when its window closed to that call; the rows that transaction
    committed later are the call's, proven by the id, and go to `Swept.attached`, not to the finding.
    `sessions` maps the backend pid of any session running then to the call: a found row that session wrote
    is counted in `Swept.probably` (a pid is used again by later transactions, so it proves nothing)."""
    starts, ends = windows_of(ranges)
    late, sessions = late or {}, sessions or {}
    with database.connected(place, timeout=600) as connection:
        sql, lag, roles, limit, swept = _begun(connection, after, lag_seconds, horizon)
        with captured.snapshot(connection):
            for change, tbl, at, who, old, xid, pid in captured.streamed(connection, sql, [lag, after]):
                if limit is not None and change > limit:
                    break
                if not (covered(starts, ends, change) or (roles and who not in roles)):
                    if xid is not None and xid in late:
                        _attached(swept, late[xid], xid, change, tbl)
                    elif not old:
                        break
                    else:
                        _found(swept, change, tbl, at, who)
                        if pid is not None and pid in sessions:
                            swept.probably[sessions[pid]] = swept.probably.get(sessions[pid], 0) + 1
                swept.upto = change
    return swept


def _begun(connection, after: int, lag_seconds: int, horizon: dict | None):
    """The sweep's query and its lag parameter, the agents' roles (PostgreSQL), the change id it may not
    pass (PostgreSQL: `sweep`'s horizon) and its `Swept`, for the capture on `connection`."""
    if connection.dialect != POSTGRESQL:
        # A replace's marker ('R', `capture.sqlite_table`) is no change of its own.
        sql = (f"SELECT id, tbl, at, NULL, at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?), NULL, NULL "
               f"FROM {capture.SQLITE_CHANGES} WHERE id > ? AND op <> 'R' ORDER BY id")
        return sql, f"-{lag_seconds} seconds", set(), None, Swept(upto=after)
    roles = {r for (r,) in connection.rows(f"SELECT role FROM {capture.CAPTURE_SCHEMA}.agents")}
    last, running_until, oldest_running = connection.rows(PG_HORIZON)[0]
    earlier = horizon or {}
    settled = earlier and oldest_running >= int(earlier.get("xmax", 0))
    sql = (f"SELECT id, tbl, at::text, who::text, at < clock_timestamp() - make_interval(secs => %s), "
           f"mod(txid::text::bigint, 4294967296), pid FROM {capture.CHANGES} WHERE id > %s ORDER BY id")
    # The horizon the next sweep waits for: the one not reached yet, or where ids are now.
    swept = Swept(upto=after, horizon=dict(earlier) if earlier and not settled else {
        "last": int(last or 0), "xmax": int(running_until)})
    return sql, lag_seconds, roles, int(earlier["last"]) if settled else after, swept


def _attached(swept: Swept, call: Any, xid: int, change: int, table: str) -> None:
    late = swept.attached.setdefault(call, Late(xid=xid))
    late.rows += 1
    late.tables[table] = late.tables.get(table, 0) + 1
    late.first, late.last = late.first or change, change


def _found(swept: Swept, change: int, table: str, at: str, who: str | None) -> None:
    swept.rows += 1
    swept.tables[table] = swept.tables.get(table, 0) + 1
    swept.first = swept.first or change
    swept.last, swept.since, swept.until = change, swept.since or at, at
    if who and who not in swept.roles:
        swept.roles.append(who)
