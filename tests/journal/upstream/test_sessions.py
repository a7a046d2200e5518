"""One upstream session per agent session: nothing a tool server keeps per session is shared between two
agents, or two sessions of one agent. A stdio server gets a process per agent session, started on first
use and stopped when the session ends, when it has been idle, or to make room."""

import logging
import sys
import time
from pathlib import Path

import anyio
import pytest
from celery.utils.log import LoggingProxy

from journal import services
from journal.models import Step
from journal.upstream.client import Endpoint, ToolServerError, Upstreams
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server

from ..helpers import register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = [sys.executable, str(Path(__file__).resolve().parents[2] / "fixtures" / "slow_stdio_server.py")]


def wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def slow(tmp_path):
    """The slow stdio server, registered; its ledger says when each of its processes started and stopped."""
    ledger = tmp_path / "ledger"
    services.refresh_catalogue(
        server=services.register_tool_server(name="slow", command=" ".join([*SLOW, str(ledger)]))
    )
    ledger.unlink()  # reading the catalogue started (and stopped) a process of its own
    return ledger


def pids(recorder, token: str, *, mode: str, calls: int = 2) -> list[str]:
    async def script(client):
        return [(await client.call_tool("slow__pid", {})).content[0].text for _ in range(calls)]

    return run_agent(recorder, token, script, mode=mode)


def test_two_agents_get_a_process_each_and_an_agents_calls_stay_in_its_own(recorder, dana, slow):
    _, ada = services.create_agent(name="ada", on_behalf_of=dana)
    _, bob = services.create_agent(name="bob", on_behalf_of=dana)
    first, second, again = (
        pids(recorder, ada, mode="auto"),
        pids(recorder, bob, mode="auto"),
        pids(recorder, ada, mode="auto"),
    )
    assert len(set(first)) == len(set(second)) == 1  # one process serves all of an agent's calls
    assert first[0] != second[0]
    assert again == first  # a stateless (2026-07-28) agent's calls are one session for the Recorder
    assert slow.read_text() == "started\nstarted\n"
    assert Step.objects.filter(status="ok").count() == 6


def test_each_handshake_session_gets_its_own_process_stopped_when_the_session_ends(recorder, dana, slow):
    _, token = services.create_agent(name="ada", on_behalf_of=dana)
    first = pids(recorder, token, mode="legacy")
    assert wait_for(lambda: slow.read_text() == "started\nstopped\n"), slow.read_text()  # the agent's DELETE
    second = pids(recorder, token, mode="legacy")
    assert first[0] == first[1] and second[0] == second[1] and first[0] != second[0]


def test_a_handshake_servers_session_state_is_never_another_agents(recorder, dana):
    port = free_port()
    with ServerThread(handshake_server.build_app(), port) as upstream:
        services.refresh_catalogue(
            server=services.register_tool_server(name="memo", url=f"{upstream.base}/mcp")
        )
        _, ada = services.create_agent(name="ada", on_behalf_of=dana)
        _, bob = services.create_agent(name="bob", on_behalf_of=dana)

        async def remember_then_recall(client):
            await client.call_tool("memo__remember", {"value": "ada's secret"})
            return (await client.call_tool("memo__recall", {})).content[0].text

        async def recall(client):
            return (await client.call_tool("memo__recall", {})).content[0].text

        assert run_agent(recorder, ada, remember_then_recall) == "ada's secret"
        assert run_agent(recorder, bob, recall) == "nothing"
        assert run_agent(recorder, ada, recall) == "ada's secret"  # ada's stateless calls: one session
        assert run_agent(recorder, ada, recall, mode="legacy") == "nothing"  # a session of its own


def upstream_calls(script, **options):
    async def main():
        async with Upstreams(timeout=10, **options) as upstreams:
            return await script(upstreams)

    return anyio.run(main)


def test_an_idle_session_is_closed_and_its_process_stopped(tmp_path):
    ledger = tmp_path / "ledger"
    slow = Endpoint("slow", "stdio", command=" ".join([*SLOW, str(ledger)]))

    async def script(upstreams):
        await upstreams.call_tool(slow, "pid", {}, owner=("ada", ""))
        assert upstreams.open_sessions(("ada", "")) == ["slow"]
        for _ in range(100):
            if not upstreams.open_sessions(("ada", "")) and "stopped" in ledger.read_text():
                break
            await anyio.sleep(0.05)
        return upstreams.open_sessions(("ada", ""))

    assert upstream_calls(script, idle_seconds=0.4) == []
    assert ledger.read_text() == "started\nstopped\n"


def test_past_the_limit_the_least_recently_used_idle_session_makes_room(tmp_path):
    ledger = tmp_path / "ledger"
    slow = Endpoint("slow", "stdio", command=" ".join([*SLOW, str(ledger)]))

    async def script(upstreams):
        ada = await upstreams.call_tool(slow, "pid", {}, owner=("ada", ""))
        bob = await upstreams.call_tool(slow, "pid", {}, owner=("bob", ""))
        assert ada != bob
        return upstreams.open_sessions(("ada", "")), upstreams.open_sessions(("bob", ""))

    assert upstream_calls(script, max_sessions=1) == ([], ["slow"])
    assert wait_for(lambda: ledger.read_text().count("stopped") == 2)  # ada's to make room, bob's at the end


def test_past_the_limit_with_every_session_busy_the_call_is_refused_and_nothing_is_sent(tmp_path):
    ledger = tmp_path / "ledger"
    slow = Endpoint("slow", "stdio", command=" ".join([*SLOW, str(ledger)]))

    async def script(upstreams):
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: upstreams.call_tool(slow, "wait", {"seconds": 2}, owner=("ada", "")))
            await anyio.sleep(0.2)  # ada's session is being opened: that counts as in use too
            with pytest.raises(ToolServerError):
                await upstreams.call_tool(slow, "pid", {}, owner=("bob", ""))
            while not ledger.exists():
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # ada's call is under way
            with pytest.raises(ToolServerError) as refused:
                await upstreams.call_tool(slow, "pid", {}, owner=("bob", ""))
        return refused.value

    refused = upstream_calls(script, max_sessions=1)
    assert refused.transient and not refused.may_have_acted
    assert "RECORDER_MAX_UPSTREAM_SESSIONS" in refused.message
    assert ledger.read_text().count("started") == 1


def test_a_stateless_http_server_serves_every_owner_on_one_connection(sample_servers):
    register_samples(sample_servers, names=("legacy",))
    echo = Endpoint("legacy", "http", url=sample_servers.url("legacy"))

    async def script(upstreams):
        for owner in (("ada", ""), ("bob", "s1"), None):
            await upstreams.call_tool(echo, "echo", {"n": 1}, owner=owner)
        return [upstreams.open_sessions(owner) for owner in (("ada", ""), ("bob", "s1"), None)]

    assert upstream_calls(script) == [[], [], ["legacy"]]


def test_a_stdio_server_starts_where_stderr_is_no_file_as_in_a_celery_worker(tmp_path, monkeypatch):
    """A Celery worker replaces `sys.stderr` with a logging proxy, which has no file descriptor: the checks
    and undos it sends to a stdio server (the official filesystem and memory servers) still start it."""
    ledger = tmp_path / "ledger"
    slow = Endpoint("slow", "stdio", command=" ".join([*SLOW, str(ledger)]))
    monkeypatch.setattr(sys, "stderr", LoggingProxy(logging.getLogger("celery.redirected")))

    async def script(upstreams):
        return (await upstreams.call_tool(slow, "pid", {}, owner=("ada", "")))["content"][0]["text"]

    assert upstream_calls(script).isdigit()
    assert ledger.read_text().startswith("started\n")
