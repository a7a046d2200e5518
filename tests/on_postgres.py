"""The second half of `make test`: the tests marked `postgres` (locking, concurrency) again on PostgreSQL.

Runs them when TEST_POSTGRES_URL is set (.ci/run sets it); otherwise says so, and fails in CI."""

import os
import subprocess
import sys
from urllib.parse import urlsplit

import psycopg

url = os.environ.get("TEST_POSTGRES_URL", "")
if not url:
    message = "PostgreSQL pass: not run, TEST_POSTGRES_URL is not set (CI sets it)."
    if os.environ.get("REQUIRE_SERVICES") == "1":
        sys.exit(message + " It is required in CI.")
    print(message)
    sys.exit(0)
env = {**os.environ, "DATABASE_URL": url}
status = subprocess.call([sys.executable, "-m", "pytest", "-m", "postgres", *sys.argv[1:]], env=env)

# pytest-django drops the test database at the end, unless a process the tests started (a Recorder or a
# worker being killed) still holds a session on it at that moment: the database would outlive the run, and
# its owner could not be dropped. It is dropped here, whatever holds it.
test_database = "test_" + urlsplit(url).path.lstrip("/")
with psycopg.connect(url, autocommit=True) as connection:
    connection.execute(f'DROP DATABASE IF EXISTS "{test_database}" WITH (FORCE)')
sys.exit(status)
