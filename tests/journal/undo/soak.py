"""The differential soak of issue 58: a generated mix of statements (reads, writes, DDL, transaction
control, functions, views, cascades, replacements, texts cut otherwise by DBHub, touches of the capture)
sent through a database pack's real server by agents, and after each call the database's own view of every
table (read by the Recorder's login, not through the capture) compared with what the record attributes. The
figure that must be 0: rows the database changed that no step holds and no held, refused or unknown step
explains. Shared by test_database_soak.py and bench/database_soak.py."""

import json
import random
import sqlite3
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from journal.undo.database.reading import CAPTURE_SCHEMA, SQLITE_PREFIX

# What the CRM of databases.py gets besides: orders that go with their company (not captured), a function
# that deletes and a view that calls it (PostgreSQL), and a table the agent may fill without a key (notes).
PG_EXTRA = [
    "CREATE TABLE orders (id integer PRIMARY KEY, company_id integer REFERENCES companies (id) "
    "ON DELETE CASCADE)",
    "INSERT INTO companies (id, name) VALUES (11, 'Company 11'), (12, 'Company 12')",
    "INSERT INTO orders SELECT n, 11 + n % 2 FROM generate_series(1, 20) n",
    "CREATE FUNCTION purge() RETURNS int LANGUAGE sql VOLATILE AS "
    "$$ DELETE FROM contacts WHERE id IN (SELECT id FROM contacts ORDER BY id LIMIT 2) RETURNING 1 $$",
    "CREATE VIEW purging AS SELECT id, purge() AS gone FROM contacts",
]
SQLITE_EXTRA = [
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, company_id INTEGER REFERENCES companies (id) "
    "ON DELETE CASCADE)",
    "INSERT INTO companies (id, name) VALUES (11, 'Company 11'), (12, 'Company 12')",
    *(f"INSERT INTO orders (id, company_id) VALUES ({n}, {11 + n % 2})" for n in range(1, 21)),
    "CREATE TABLE tags (id INTEGER PRIMARY KEY ON CONFLICT REPLACE, label TEXT)",
    "INSERT INTO tags VALUES (1, 'vip'), (2, 'churned')",
]
CAPTURED = ("contacts", "companies", "tags")  # tags on SQLite only


def statements(dialect: str, count: int, seed: int) -> list[str]:
    """`count` statements of every kind an agent may send, for `dialect`."""
    chosen = random.Random(seed)

    def contact() -> int:
        return chosen.randint(1, 200)

    common = [
        lambda: "SELECT count(*) FROM contacts",
        lambda: f"SELECT * FROM contacts WHERE id = {contact()}",
        lambda: f"SELECT c.name, co.name FROM contacts c JOIN companies co ON co.id = c.company_id "
                f"WHERE c.id < {contact()}",
        lambda: f"SELECT lower(name), length(email) FROM contacts WHERE id = {contact()}",
        lambda: f"UPDATE contacts SET status = 's{chosen.randint(0, 99)}' WHERE id = {contact()}",
        lambda: f"UPDATE contacts SET status = 'bulk' WHERE id BETWEEN {contact()} AND {contact() + 5}",
        lambda: f"DELETE FROM contacts WHERE id = {contact()}",
        lambda: (f"INSERT INTO contacts (id, name, email, status) VALUES ({chosen.randint(1000, 10 ** 6)}, "
                 "'New', 'new@x.test', 'lead')"),
        lambda: f"UPDATE companies SET name = 'C{chosen.randint(0, 9)}' WHERE id = {chosen.randint(1, 12)}",
        lambda: f"UPDATE notes SET body = 'b{chosen.randint(0, 9)}'",
        lambda: "INSERT INTO notes (body) VALUES ('note')",
        lambda: f"DELETE FROM orders WHERE id = {chosen.randint(1, 20)}",
        lambda: f"DELETE FROM companies WHERE id = {chosen.choice((11, 12))}",
        lambda: f"CREATE TABLE t{chosen.randint(0, 999)} (id integer PRIMARY KEY)",
        lambda: f"DROP TABLE IF EXISTS t{chosen.randint(0, 999)}",
        lambda: "DROP TABLE notes",
        lambda: "DELETE FROM orders WHERE true",
        lambda: "BEGIN",
        lambda: "COMMIT",
        lambda: "ROLLBACK",
        lambda: f"BEGIN; UPDATE contacts SET status = 'tx' WHERE id = {contact()}; COMMIT",
        lambda: f"BEGIN; DELETE FROM contacts WHERE id = {contact()}",
        lambda: f"SELECT 1; COMMIT; DELETE FROM contacts WHERE id = {contact()}",
    ]
    postgresql = [
        lambda: "SELECT purge()",
        lambda: "SELECT count(*) FROM purging",
        lambda: f"SELECT 1 AS a$q$ -- $q$; DELETE FROM contacts WHERE id = {contact()}",
        lambda: "SELECT * FROM undo_capture.changes",
        lambda: "SET undo_capture.restoring = 'on'",
        lambda: "SELECT set_config('undo_capture.restoring', 'on', false)",
        lambda: "TRUNCATE orders",
        lambda: (f"WITH gone AS (DELETE FROM contacts WHERE id = {contact()} RETURNING id) "
                 "SELECT count(*) FROM gone"),
    ]
    sqlite_ = [
        lambda: (f"INSERT OR REPLACE INTO contacts (id, name, email, status) VALUES ({contact()}, 'R', "
                 "'r@x.test', 'lead')"),
        lambda: f"INSERT INTO tags VALUES ({chosen.randint(1, 3)}, 'x')",
        lambda: (f"INSERT /* */ OR /* */ REPLACE INTO contacts (id, name, email, status) VALUES "
                 f"({contact()}, 'R', 'r@x.test', 'lead')"),
        lambda: "DELETE FROM _undo_capture_changes",
        lambda: "SELECT * FROM _undo_capture_changes",
        lambda: "CREATE TRIGGER tidy AFTER INSERT ON contacts BEGIN DELETE FROM _undo_capture_changes; END",
        lambda: "PRAGMA recursive_triggers = ON",
    ]
    kinds = common + (postgresql if dialect == "postgresql" else sqlite_)
    return [chosen.choice(kinds)() for _ in range(count)]


# -- the database's own view --------------------------------------------------------------------------------


def snapshot(place: str) -> dict[str, dict[str, str]]:
    """Every row of every table the agent's tables (not the capture's), by table and key (the primary key's
    values; a table without one by the row and its count), each row as canonical JSON."""
    if place.startswith("postgres"):
        return _pg_snapshot(place)
    return _sqlite_snapshot(place)


def _pg_snapshot(url: str) -> dict[str, dict[str, str]]:
    found = {}
    with psycopg.connect(url, autocommit=True) as connection:
        tables = connection.execute(
            "SELECT n.nspname || '.' || c.relname, coalesce((SELECT array_agg(a.attname ORDER BY k.n) "
            "FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = c.oid AND i.indisprimary), "
            "'{}') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND "
            "n.nspname NOT IN ('pg_catalog', 'information_schema', %s) AND n.nspname NOT LIKE 'pg_toast%%'",
            (CAPTURE_SCHEMA,)).fetchall()
        for table, key in tables:
            schema, name = table.split(".", 1)
            rows = connection.execute(f'SELECT to_jsonb(t) FROM "{schema}"."{name}" t').fetchall()
            found[table] = _keyed([row for (row,) in rows], list(key))
    return found


def _sqlite_snapshot(path: str) -> dict[str, dict[str, str]]:
    found = {}
    connection = sqlite3.connect(path)
    try:
        tables = [name for (name,) in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "AND name NOT LIKE ?", (f"{SQLITE_PREFIX}%",))]
        for table in tables:
            info = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
            columns = [c[1] for c in info]
            key = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5]]
            rows = [dict(zip(columns, [{"$blob": v.hex().upper()} if isinstance(v, bytes) else v
                                       for v in row], strict=True))
                    for row in connection.execute(f'SELECT * FROM "{table}"')]
            found[table] = _keyed(rows, key)
    finally:
        connection.close()
    return found


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _keyed(rows: list[dict], key: list[str]) -> dict[str, str]:
    if key:
        return {canonical([row.get(k) for k in key]): canonical(row) for row in rows}
    counted = Counter(canonical(row) for row in rows)
    return {f"{text}#{n}": text for text, times in counted.items() for n in range(times)}


def changed(before: dict, after: dict) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """Every row that differs: {(table, key): (before, after)} (a row of a table dropped or made counts)."""
    found = {}
    for table in set(before) | set(after):
        old, new = before.get(table, {}), after.get(table, {})
        for key in set(old) | set(new):
            if old.get(key) != new.get(key):
                found[(table, key)] = (old.get(key), new.get(key))
    return found


# -- what the record attributes -----------------------------------------------------------------------------


@dataclass
class Tally:
    """The soak's figures."""

    statements: int = 0
    kinds: Counter = field(default_factory=Counter)  # how the steps ended: read, undoable, held, refused…
    rows_changed: int = 0
    unexplained: list[str] = field(default_factory=list)

    @property
    def figure(self) -> int:
        return len(self.unexplained)

    def line(self, name: str) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        return (f"{name}: {self.statements} statements ({kinds}); rows the database changed: "
                f"{self.rows_changed}; changed rows no step holds or explains: {self.figure}")


def standing(step) -> str:
    """How a step ended, for the tally: refused, held, failed (changed nothing), read, undoable, or what it
    is when it cannot be undone (none, unknown)."""
    decision = (step.policy_decision or {}).get("decision")
    if decision == "deny":
        return "refused"
    if step.status == "held" or step.failure_class == "policy":
        return "held"
    return step.reversibility if step.status == "ok" or step.reversibility != "read_only" else "failed"


def judge(step, rows: dict, tally: Tally, text: str) -> None:
    """Compare the rows the database changed during one call with what its step holds."""
    tally.statements += 1
    kind = standing(step)
    tally.kinds[kind] += 1
    tally.rows_changed += len(rows)
    if not rows or kind in ("none", "unknown"):
        return  # nothing changed, or the step says it cannot be undone or is unknown: a person decides
    if kind != "compensate":
        tally.unexplained += [f"{text!r} ({kind}) changed {t} {k}" for t, k in rows]
        return
    net = _net((step.earlier_state or {}).get("left", {}).get("database", {}).get("rows") or [])
    for (table, key), change in rows.items():
        held = net.get((_bare(table), key), "nothing")
        if held != change:  # the row before the call and after it, as the database has them
            tally.unexplained.append(f"{text!r} changed {table} {key}: the step holds {held}, the database "
                                     f"has {change}")


def _bare(table: str) -> str:
    return table.removeprefix("public.").removeprefix("main.")


def _net(captured: list[dict]) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """Each captured row's first image and last over the call (None: not there)."""
    found = {}
    for row in sorted(captured, key=lambda r: r["id"]):
        before, after = (canonical(image) if image is not None else None
                         for image in (row.get("before"), row.get("after")))
        where = (_bare(row["table"]), canonical(row["key"]))
        found[where] = (found[where][0] if where in found else before, after)
    return found


def judge_together(steps, rows: dict, tally: Tally) -> None:
    """Several agents at once: the rows the database changed over all their calls against the net of every
    row all their steps hold, in the capture's order (each call's window is its own, so their rows never
    interleave)."""
    held: list[dict] = []
    for step in steps:
        kind = standing(step)
        tally.statements += 1
        tally.kinds[kind] += 1
        held += (step.earlier_state or {}).get("left", {}).get("database", {}).get("rows") or []
    tally.rows_changed += len(rows)
    net = _net(held)
    for (table, key), change in rows.items():
        found = net.get((_bare(table), key), "nothing")
        if found != change:
            tally.unexplained.append(f"{table} {key}: the steps hold {found}, the database has {change}")
