"""The fault tests at full size, with their figures.

    [TEST_POSTGRES_URL=postgres://...] .venv/bin/python bench/faults.py [--runs 20]

Runs tests/faults with FAULT_RUNS plans of 20 items each: the worker killed with SIGKILL at random moments,
a prefork worker's pool child killed the same way while its parent lives on (most kills landing after the
calendar made a compensation and before the worker recorded it), and Redis killed and restarted mid-plan
(needs redis-server), plus tool servers that fail in every way; and FAULT_RUNS kills of every Recorder
process in the middle of a journal group while agents call (on SQLite; with TEST_POSTGRES_URL set, the tests
marked for it run again on PostgreSQL).
Prints the figures the tests print: the kills and where they landed, compensations applied twice, lost,
and pairs out of reverse order.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    env = {**os.environ, "FAULT_RUNS": str(args.runs), "VAR_DIR": str(ROOT / "var" / "faults")}
    env.setdefault("TEST_REDIS_URL", "redis://localhost:6379/13")  # the Recorder processes' bus
    passes = [("SQLite", [sys.executable, "-m", "pytest"])]
    if env.get("TEST_POSTGRES_URL"):
        passes.append(("PostgreSQL", [sys.executable, "tests/on_postgres.py"]))
    for name, command in passes:
        print(f"{name}:")
        result = subprocess.run([*command, "-q", "-s", "-p", "no:cacheprovider", "tests/faults"], cwd=ROOT,
                                env=env, capture_output=True, text=True)
        for line in result.stdout.splitlines():
            if " faults" in line or "passed" in line or "failed" in line:
                print(line.strip())
        if result.returncode:
            print(result.stdout[-3000:], result.stderr[-2000:], sep="\n")
            sys.exit(result.returncode)

if __name__ == "__main__":
    main()
