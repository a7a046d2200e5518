"""Personas and real servers for the whole suite.

`sample_servers` runs the sample tool servers over streamable HTTP on a free port; `recorder` runs the
project's own ASGI application (Django and the Recorder at /mcp/) under uvicorn against the test database.
Both are real HTTP servers in this process's threads: what crosses them is real MCP.
"""

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from django.contrib.auth.models import Group, User

from journal.auth import roles


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    def __init__(self, app, port: int):
        self.port = port
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="on", timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Samples:
    def __init__(self, thread: ServerThread, servers):
        self.thread = thread
        self.servers = servers

    def url(self, name: str) -> str:
        return f"{self.thread.base}/{name}/mcp"

    def ledger(self, name: str) -> list[dict]:
        return httpx.get(f"{self.thread.base}/{name}/ledger").json()["ledger"]

    def set_mode(self, name: str, mode: str = "normal", delay_ms: int = 0, answer_delay_ms: int = 0) -> None:
        """`delay_ms` holds a call before it acts; `answer_delay_ms` after it acted, before it answers."""
        httpx.post(f"{self.thread.base}/{name}/control",
                   json={"mode": mode, "delay_ms": delay_ms, "answer_delay_ms": answer_delay_ms}
                   ).raise_for_status()

    def colleague_update(self, deal_id: str, changes: dict, by: str = "priya") -> dict:
        response = httpx.post(f"{self.thread.base}/crm/colleague/update_deal",
                              json={"deal_id": deal_id, "changes": changes, "by": by})
        response.raise_for_status()
        return response.json()


@pytest.fixture(autouse=True)
def _isolated_keys(settings, tmp_path):
    settings.RECORDER_KEY_DIR = tmp_path / "recorder-keys"


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with no per-address counts (journal.auth.throttling): the test client's address is
    always 127.0.0.1, and the suite registers far more OAuth clients than one address may in an hour."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def sample_servers(tmp_path):
    from samples.app import build_app

    app, servers = build_app(Path(tmp_path) / "samples")
    with ServerThread(app, free_port()) as thread:
        yield Samples(thread, servers)


@pytest.fixture
def recorder(transactional_db):
    from approver.asgi import build_application

    with ServerThread(build_application(), free_port()) as thread:
        yield thread


def _persona(username: str, *role_names: str) -> User:
    user = User.objects.create_user(username=username, password=f"{username}-password-1")
    for name in role_names:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


@pytest.fixture
def dana(db):
    """The person the agent acts for."""
    return _persona("dana")


@pytest.fixture
def on_call(db):
    return _persona("olivia", roles.ON_CALL)


@pytest.fixture
def approver_user(db):
    return _persona("ana", roles.APPROVER)


@pytest.fixture
def second_approver(db):
    return _persona("bo", roles.APPROVER)


@pytest.fixture
def admin_user(db):
    return _persona("ada", roles.ADMIN)


@pytest.fixture
def outsider(db):
    return _persona("otto")


@pytest.fixture(autouse=True)
def empty_broker_queue():
    """Plans ring the worker when they commit; no test leaves a message behind for a later test's worker."""
    from django.conf import settings

    def empty():
        for message in (settings.BROKER_DIR / "queue").glob("*"):
            message.unlink(missing_ok=True)

    empty()  # also whatever an interrupted earlier run left
    yield
    empty()


@pytest.fixture
def globex(recorder, sample_servers, dana):
    """The Globex story, told through the Recorder by sales-bot for Dana: read deal D-881, mark it Won,
    book the kickoff, email the buyer."""
    import anyio

    from journal import services as journal_services
    from journal.models import Run
    from samples import agent as scripted
    from tests.journal.helpers import register_samples, settle

    register_samples(sample_servers)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))
    settle(recorder)
    return Run.objects.get(key=f"run:{scripted.RUN_ID}")
