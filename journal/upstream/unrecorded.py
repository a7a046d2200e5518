"""Rows the capture kept that no recorded call's window holds: changes made to a captured table while no
call of the Recorder's was in flight (a transaction an agent's server committed later, a tool that writes
outside the Recorder, anyone with the agent's credentials). The capture sees every writer; the windows say
which rows were calls'. What is left is never dropped silently: the sweep finds it before the prune may
forget it, and the server's page, the metrics and the log say so. On PostgreSQL only the rows of the agents'
roles count (another role's rows are another writer's, as inside a window); on SQLite, which has no roles,
every such row does. Synchronous, on the Recorder's own connection."""

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

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

    def as_record(self, now: str) -> dict:
        return {"found": now, "rows": self.rows, "tables": dict(sorted(self.tables.items())),
                "from": self.first, "to": self.last, "since": self.since, "until": self.until,
                **({"roles": sorted(self.roles)} if self.roles else {})}


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
          horizon: dict | None = None) -> Swept:
    """The capture's rows after change `after`, read against the calls' windows (`ranges`): the sweep goes
    past every row a window holds and every other writer's, and stops at the first row outside every window
    that is younger than `lag_seconds` (its call may still be in flight, its window not yet recorded). On
    PostgreSQL a change id is taken when its row is written and may be committed much later, so a sweep
    goes no further than the last id handed out at the sweep before (`horizon`) once every transaction then
    running has ended; it leaves the horizon for the next in `Swept.horizon`."""
    starts, ends = windows_of(ranges)
    with database.connected(place, timeout=600) as connection:
        postgresql = connection.dialect == POSTGRESQL
        table = capture.CHANGES if postgresql else capture.SQLITE_CHANGES
        limit = None
        if postgresql:
            roles = {r for (r,) in connection.rows(f"SELECT role FROM {capture.CAPTURE_SCHEMA}.agents")}
            last, running_until, oldest_running = connection.rows(PG_HORIZON)[0]
            earlier = horizon or {}
            settled = earlier and oldest_running >= int(earlier.get("xmax", 0))
            limit = int(earlier["last"]) if settled else after
            sql = (f"SELECT id, tbl, at::text, who::text, at < clock_timestamp() - make_interval(secs => %s) "
                   f"FROM {table} WHERE id > %s ORDER BY id")
        else:
            roles = set()
            # A replace's marker ('R', `capture.sqlite_table`) is no change of its own.
            sql = (f"SELECT id, tbl, at, NULL, at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) FROM {table} "
                   "WHERE id > ? AND op <> 'R' ORDER BY id")
        lag = lag_seconds if postgresql else f"-{lag_seconds} seconds"
        swept = Swept(upto=after)
        if postgresql:  # the horizon the next sweep waits for: the one not reached yet, or where ids are now
            swept.horizon = dict(earlier) if earlier and not settled else {
                "last": int(last or 0), "xmax": int(running_until)}
        with captured.snapshot(connection):
            for change, tbl, at, who, old in captured.streamed(connection, sql, [lag, after]):
                if limit is not None and change > limit:
                    break
                if not (covered(starts, ends, change) or (roles and who not in roles)):
                    if not old:
                        break
                    _found(swept, change, tbl, at, who)
                swept.upto = change
    return swept


def _found(swept: Swept, change: int, table: str, at: str, who: str | None) -> None:
    swept.rows += 1
    swept.tables[table] = swept.tables.get(table, 0) + 1
    swept.first = swept.first or change
    swept.last, swept.since, swept.until = change, swept.since or at, at
    if who and who not in swept.roles:
        swept.roles.append(who)
