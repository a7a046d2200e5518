"""The differential soak of issue 58 at full size: a generated mix of statements (reads, writes, DDL,
transaction control, functions, views, cascades, replacements, texts DBHub cuts otherwise, touches of the
capture) through each database pack's real server (mcp-server-sqlite; DBHub on SQLite and PostgreSQL; the
reference PostgreSQL server), each call's rows compared with the database's own view of every table. Prints,
for each pack, how the calls ended and the figure that must be 0: rows the database changed that no step
holds and no held, refused or unknown step explains.

    .venv/bin/python bench/database_soak.py [--statements 10000]

Runs tests/journal/undo/test_database_soak.py with SOAK_STATEMENTS set (PostgreSQL from TEST_POSTGRES_URL).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=10_000, help="statements through each pack")
    args = parser.parse_args()
    report = Path(tempfile.mkdtemp(prefix="database-soak-")) / "figures.txt"
    env = {**os.environ, "SOAK_STATEMENTS": str(args.statements), "SOAK_REPORT": str(report),
           "VAR_DIR": str(report.parent / "var")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/journal/undo/test_database_soak.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    lines = report.read_text().splitlines() if report.exists() else []
    print(f"{args.statements:,} statements through each pack ({seconds:,.0f} s in all)")
    for line in lines:
        print(f"  {line}")
    if done.returncode != 0 or len(lines) < 4:
        print(done.stdout[-4000:])
        sys.exit(f"the soak did not pass on every pack (pytest exited {done.returncode})")


if __name__ == "__main__":
    main()
