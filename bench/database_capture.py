"""What the undo capture costs a database, and how fast a big statement is captured, checked and undone.

    .venv/bin/python bench/database_capture.py [--rows 100000] [--updates 5000] [--postgres URL]

1. Single-row UPDATEs, each its own transaction (as pgbench's simple update does), on a 10,000-row table
   without the capture and then with it: the time per row, and the ratio (target: at most 1.5x).
2. One UPDATE of --rows rows with the capture on: rows per second captured (the statement's own time), then
   the rows read from the capture as the Recorder reads them after a call, checked row by row against the
   database, and put back in one transaction: rows per second for each (target: at least 20,000/s), and the
   process's peak resident memory after each phase.

SQLite always (a scratch file); PostgreSQL too with --postgres (a scratch database is created on that server
and dropped after).
"""

import argparse
import os
import random
import resource
import secrets
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")
os.environ.setdefault("VAR_DIR", tempfile.mkdtemp(prefix="database-capture-"))

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402

from approver import database_checks  # noqa: E402
from journal.undo.database.rows import net  # noqa: E402
from journal.upstream import database, restore, windows  # noqa: E402

TABLE_ROWS = 10_000


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_table(execute, rows: int, dialect: str) -> None:
    execute("CREATE TABLE accounts (id integer PRIMARY KEY, owner text NOT NULL, balance integer NOT NULL, "
            "status text NOT NULL)")
    if dialect == "sqlite":
        execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO accounts SELECT i, 'owner ' || i, i * 10, 'open' FROM n", (rows,))
    else:
        execute("INSERT INTO accounts SELECT i, 'owner ' || i, i * 10, 'open' FROM generate_series(1, %s) i",
                (rows,))


def single_row_updates(execute, updates: int, dialect: str) -> float:
    """Seconds per single-row UPDATE, each its own transaction."""
    mark = "?" if dialect == "sqlite" else "%s"
    rng = random.Random(1)
    started = time.perf_counter()
    for _ in range(updates):
        execute(f"UPDATE accounts SET balance = balance + 1 WHERE id = {mark}", (rng.randint(1, TABLE_ROWS),))
    return (time.perf_counter() - started) / updates


def write_overhead(place: str, execute, updates: int, dialect: str) -> None:
    make_table(execute, TABLE_ROWS, dialect)
    single_row_updates(execute, updates // 10, dialect)  # warm
    plain = single_row_updates(execute, updates, dialect)
    database.install(place, ["accounts"])
    captured = single_row_updates(execute, updates, dialect)
    print(f"  single-row UPDATE, own transaction: {plain * 1e3:.3f} ms without the capture, "
          f"{captured * 1e3:.3f} ms with it: {captured / plain:.2f}x the time per row")


def big_statement(place: str, execute, rows: int, dialect: str) -> None:
    execute("DROP TABLE IF EXISTS accounts")
    make_table(execute, rows, dialect)
    database.install(place, ["accounts"])
    window = windows.opened(place)
    started = time.perf_counter()
    execute("UPDATE accounts SET status = 'closed', balance = 0")
    update = time.perf_counter() - started
    print(f"  UPDATE of {rows:,} rows with the capture: {rows / update:,.0f} rows/s captured "
          f"(peak {peak_mb():.0f} MB)")
    started = time.perf_counter()
    found = windows.closed(window, tables=["accounts", "public.accounts"], keep=rows)
    read = time.perf_counter() - started
    assert found["count"] == rows, found.get("problem")
    print(f"  its rows read from the capture into the record: {rows / read:,.0f} rows/s "
          f"(peak {peak_mb():.0f} MB)")
    earlier = {"left": {"database": found}}
    started = time.perf_counter()
    status, detail = database_checks.check(place=place, earlier=earlier)
    check = time.perf_counter() - started
    assert status == "ok" and detail["rows"]["restore"] == rows, (status, detail.get("message"))
    print(f"  checked row by row: {rows / check:,.0f} rows/s (peak {peak_mb():.0f} MB)")
    changes = net(found["rows"])
    started = time.perf_counter()
    done = restore.put_back(place, changes, marker=f"bench:{secrets.token_hex(4)}",
                            expected={c.identity(): c.after for c in changes}, leave=set())
    undo = time.perf_counter() - started
    assert done["restored"] == rows, done
    print(f"  put back in one transaction: {rows / undo:,.0f} rows/s (peak {peak_mb():.0f} MB)")


def on_sqlite(rows: int, updates: int) -> None:
    print("SQLite")
    path = Path(tempfile.mkdtemp(prefix="capture-bench-")) / "bench.db"
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    write_overhead(str(path), connection.execute, updates, "sqlite")
    big_statement(str(path), connection.execute, rows, "sqlite")
    connection.close()


def on_postgresql(url: str, rows: int, updates: int) -> None:
    print("PostgreSQL")
    name = f"capture_bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    place = url.rsplit("/", 1)[0] + f"/{name}"
    place = "postgresql://" + place.split("://", 1)[1]
    try:
        with psycopg.connect(place, autocommit=True) as connection:
            write_overhead(place, connection.execute, updates, "postgresql")
            big_statement(place, connection.execute, rows, "postgresql")
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=5000)
    parser.add_argument("--postgres", default=os.environ.get("TEST_POSTGRES_URL", ""))
    options = parser.parse_args()
    on_sqlite(options.rows, options.updates)
    if options.postgres:
        on_postgresql(options.postgres, options.rows, options.updates)


if __name__ == "__main__":
    main()
