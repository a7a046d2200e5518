"""What the undo capture costs a database, and how fast a big statement is captured, checked and undone.

    .venv/bin/python bench/database_capture.py [--rows 100000] [--updates 5000] [--postgres URL]

1. Single-row UPDATEs, each its own transaction (as pgbench's simple update does), on a 10,000-row table
   without the capture and then with it: the time per row, and the ratio (target: at most 1.5x).
2. One UPDATE of --rows rows with the capture on: rows per second captured (the statement's own time), then
   the rows read from the capture as the Recorder reads them after a call (over RECORDER_DATABASE_ROWS_KEPT,
   10,000 by default, the record keeps their count and digest and the rows stay in the capture), checked row
   by row against the database, and put back in one transaction, both reading them from the capture a batch
   at a time: rows per second for each (target: at least 20,000/s), and the process's peak resident memory
   after each phase. Each size runs in a process of its own, at a fifth of --rows and at --rows, so the two
   peaks show whether memory grows with the row count.

SQLite always (a scratch file); PostgreSQL too with --postgres (a scratch database is created on that server
and dropped after).
"""

import argparse
import os
import random
import resource
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")
os.environ.setdefault("VAR_DIR", tempfile.mkdtemp(prefix="database-capture-"))

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402

from approver import database_checks  # noqa: E402
from journal.upstream import database, restore, windows  # noqa: E402
from journal.upstream.captured import CallRows  # noqa: E402

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
    print(f"  {rows:,} rows (peak {peak_mb():.0f} MB before the statement)")
    started = time.perf_counter()
    execute("UPDATE accounts SET status = 'closed', balance = 0")
    update = time.perf_counter() - started
    print(f"  UPDATE of {rows:,} rows with the capture: {rows / update:,.0f} rows/s captured "
          f"(peak {peak_mb():.0f} MB)")
    started = time.perf_counter()
    found = windows.closed(window, tables=["accounts", "public.accounts"],
                           keep=settings.RECORDER_DATABASE_ROWS_KEPT)
    read = time.perf_counter() - started
    assert found["count"] == rows, found.get("problem")
    where = "kept in the capture, digest in the record" if found.get("inCapture") else "into the record"
    print(f"  its rows read from the capture ({where}): {rows / read:,.0f} rows/s (peak {peak_mb():.0f} MB)")
    earlier = {"left": {"database": found}}
    started = time.perf_counter()
    status, detail = database_checks.check(place=place, earlier=earlier)
    check = time.perf_counter() - started
    assert status == "ok" and detail["rows"]["restore"] == rows, (status, detail.get("message"))
    print(f"  checked row by row: {rows / check:,.0f} rows/s (peak {peak_mb():.0f} MB)")
    started = time.perf_counter()
    done = restore.put_back(place, CallRows(found), marker=f"bench:{secrets.token_hex(4)}", overrides={},
                            leave=set())
    undo = time.perf_counter() - started
    assert done["restored"] == rows, done
    print(f"  put back in one transaction: {rows / undo:,.0f} rows/s (peak {peak_mb():.0f} MB)")


def on_sqlite(rows: int, updates: int) -> None:
    path = Path(tempfile.mkdtemp(prefix="capture-bench-")) / "bench.db"
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    if updates:
        write_overhead(str(path), connection.execute, updates, "sqlite")
    else:
        big_statement(str(path), connection.execute, rows, "sqlite")
    connection.close()


def on_postgresql(url: str, rows: int, updates: int) -> None:
    name = f"capture_bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    place = url.rsplit("/", 1)[0] + f"/{name}"
    place = "postgresql://" + place.split("://", 1)[1]
    try:
        with psycopg.connect(place, autocommit=True) as connection:
            if updates:
                write_overhead(place, connection.execute, updates, "postgresql")
            else:
                big_statement(place, connection.execute, rows, "postgresql")
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def big_in_own_process(dialect: str, rows: int, url: str) -> None:
    """The big statement at `rows`, in a fresh process (so its peak memory is its own)."""
    subprocess.run([sys.executable, __file__, "--big", dialect, "--rows", str(rows), "--postgres", url],
                   check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=5000)
    parser.add_argument("--postgres", default=os.environ.get("TEST_POSTGRES_URL", ""))
    parser.add_argument("--big", choices=("sqlite", "postgresql"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.big:
        run = on_sqlite if options.big == "sqlite" else partial(on_postgresql, options.postgres)
        run(options.rows, 0)
        return
    for dialect in ("sqlite", "postgresql") if options.postgres else ("sqlite",):
        print("SQLite" if dialect == "sqlite" else "PostgreSQL")
        if dialect == "sqlite":
            on_sqlite(options.rows, options.updates)
        else:
            on_postgresql(options.postgres, options.rows, options.updates)
        for rows in (options.rows // 5, options.rows):
            big_in_own_process(dialect, rows, options.postgres)


if __name__ == "__main__":
    main()
