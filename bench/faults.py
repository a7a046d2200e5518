"""The fault tests at full size, with their figures.

    .venv/bin/python bench/faults.py [--runs 20]

Runs tests/faults with FAULT_RUNS plans of 20 items each: the worker killed with SIGKILL at random moments,
and Redis killed and restarted mid-plan (needs redis-server), plus tool servers that fail in every way.
Prints the figures the tests print: compensations applied twice, lost, and pairs out of reverse order.
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
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/faults"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    for line in result.stdout.splitlines():
        if "faults:" in line or "passed" in line or "failed" in line:
            print(line.strip())
    if result.returncode:
        print(result.stdout[-3000:], result.stderr[-2000:], sep="\n")
        sys.exit(result.returncode)


if __name__ == "__main__":
    main()
