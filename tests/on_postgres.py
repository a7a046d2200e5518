"""The second half of `make test`: the tests marked `postgres` (locking, concurrency) again on PostgreSQL.

Runs them when TEST_POSTGRES_URL is set (.ci/run sets it); otherwise says so, and fails in CI."""

import os
import subprocess
import sys

url = os.environ.get("TEST_POSTGRES_URL", "")
if not url:
    message = "PostgreSQL pass: not run, TEST_POSTGRES_URL is not set (CI sets it)."
    if os.environ.get("REQUIRE_SERVICES") == "1":
        sys.exit(message + " It is required in CI.")
    print(message)
    sys.exit(0)
env = {**os.environ, "DATABASE_URL": url}
sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-m", "postgres", *sys.argv[1:]], env=env))
