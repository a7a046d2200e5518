"""Several Recorders behind a load balancer with no sticky sessions serve one agent: whatever a session
needs between requests is in the database, so any of them answers any request of any session."""

import contextlib
import json
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services
from journal.models import AgentSession, Run, Step
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server, round_robin
from tests.services import REDIS_URL, needs_redis

from .helpers import register_samples

pytestmark = pytest.mark.django_db(transaction=True)

# An agent's handshake, raw, as the tests that send each request to a Recorder of their choosing make it.
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


def session_headers(opened) -> dict:
    """The headers every later request of the session answered by `opened` carries."""
    return {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}


@contextlib.contextmanager
def behind_a_balancer():
    from approver.asgi import build_application

    with (
        ServerThread(build_application(), free_port()) as first,
        ServerThread(build_application(), free_port()) as second,
    ):
        balancer = round_robin.build_app([first.base, second.base])
        with ServerThread(balancer, free_port()) as front:
            yield front, (first, second), balancer.served


@pytest.fixture
def recorders(transactional_db):
    with behind_a_balancer() as stack:
        yield stack


def settle_all(backends) -> None:
    for backend in backends:
        backend.app.recorder.journal.settle()


def test_a_handshake_session_is_served_by_whichever_recorder_gets_each_request(
    recorders, sample_servers, dana
):
    front, backends, served = recorders
    register_samples(sample_servers, names=("legacy",))
    _, token = services.create_agent(name="bot", on_behalf_of=dana)

    async def main():
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            async with Client(streamable_http_client(f"{front.base}/mcp/", http_client=http), mode="legacy",
                              cache=None) as client:
                tools = [tool.name for tool in (await client.list_tools()).tools]
                answers = [
                    (await client.call_tool("legacy__echo", {"n": n})).structured_content for n in range(12)
                ]
                return tools, answers

    tools, answers = anyio.run(main)
    settle_all(backends)
    assert "legacy__echo" in tools and answers == [{"n": n} for n in range(12)]
    assert {url for url, _, _ in served} == {
        backend.base for backend in backends
    }  # both answered this session
    run = Run.objects.get()
    assert list(Step.objects.filter(run=run).order_by("number").values_list("number", "status")) == [
        (n, "ok") for n in range(1, 13)]
    assert list(run.entries.order_by("seq").values_list("seq", flat=True)) == list(range(1, run.head_seq + 1))
    assert services.verify_run(run=run).ok
    assert not AgentSession.objects.exists()  # the agent ended its session (DELETE), in whichever process


def test_a_session_is_only_ever_its_agents_and_ends_everywhere(recorders, dana):
    front, (first, second), _ = recorders
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    _, other = services.create_agent(name="other", on_behalf_of=dana)

    def post(base, bearer, body, session=None):
        headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream",
                   **({"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"} if session else {})}
        return httpx2.post(f"{base}/mcp/", json=body, headers=headers, timeout=30)

    opened = post(first.base, token, INITIALIZE)
    session = opened.headers["mcp-session-id"]
    assert (
        post(
            second.base, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session
        ).status_code
        == 202
    )
    listed = post(second.base, token, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session)
    assert listed.status_code == 200 and "tools" in listed.json()["result"]
    # Another agent presenting the session id gets what it would get for any unknown session.
    assert (
        post(second.base, other, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session).status_code
        == 404
    )
    assert (
        post(first.base, other, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session).status_code
        == 404
    )
    # The agent ends it at one Recorder: it is gone at the other too.
    ended = httpx2.delete(
        f"{second.base}/mcp/",
        headers={
            "Authorization": f"Bearer {token}",
            "Mcp-Session-Id": session,
            "Mcp-Protocol-Version": "2025-11-25",
        },
    )
    assert ended.status_code == 200
    first.app.recorder.journal.settle()
    second.app.recorder.journal.settle()
    anyio.run(anyio.sleep, 1.1)  # what a process last read of a session, it trusts for a second
    assert (
        post(first.base, token, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, session).status_code
        == 404
    )


def test_a_session_unused_for_the_idle_time_is_gone_and_its_record_forgotten(recorders, dana, settings):
    from datetime import timedelta

    from django.utils import timezone

    from journal import tasks

    front, (first, second), _ = recorders
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    opened = httpx2.post(f"{first.base}/mcp/", headers=headers, json=INITIALIZE)
    session = opened.headers["mcp-session-id"]
    AgentSession.objects.filter(session_id=session).update(
        last_used_at=timezone.now() - timedelta(seconds=settings.RECORDER_SESSION_IDLE_SECONDS + 1))
    listed = httpx2.post(f"{second.base}/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={**headers, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"})
    assert listed.status_code == 404
    assert tasks.forget_idle_sessions() == 1 and not AgentSession.objects.exists()


SLOW = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "slow_stdio_server.py")]


@needs_redis
@pytest.mark.parametrize("bus", [True, False])
def test_a_cancellation_one_recorder_hears_stops_the_call_another_is_making(transactional_db, settings, dana,
                                                                              tmp_path, bus):
    """The agent posts its call to one Recorder and its `notifications/cancelled` to another, keeping the
    call's connection open: the bus carries the cancellation to the Recorder making the call, which leaves
    the upstream call (the server is told) and journals it. Without a bus, the call runs to its end."""
    settings.RECORDER_BUS_URL = REDIS_URL if bus else ""
    ledger = tmp_path / "ledger"
    services.refresh_catalogue(
        server=services.register_tool_server(name="slow", command=" ".join([*SLOW, str(ledger)]))
    )
    ledger.unlink()
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    with behind_a_balancer() as (_, (first, second), _):
        async def main():
            base = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
            async with httpx2.AsyncClient(headers=base, timeout=30) as http:
                opened = await http.post(f"{first.base}/mcp/", json=INITIALIZE)
                headers = session_headers(opened)
                await http.post(f"{second.base}/mcp/", headers=headers,
                                json={"jsonrpc": "2.0", "method": "notifications/initialized"})
                started = await http.post(
                    f"{first.base}/mcp/",
                    headers=headers,
                    json={  # the server's process is up
                        "jsonrpc": "2.0",
                        "id": 6,
                        "method": "tools/call",
                        "params": {"name": "slow__wait", "arguments": {"seconds": 0}},
                    },
                )
                assert "waited 0" in started.text
                call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                        "params": {"name": "slow__wait", "arguments": {"seconds": 4}}}
                async with anyio.create_task_group() as group:
                    group.start_soon(lambda: http.post(f"{first.base}/mcp/", headers=headers, json=call))
                    await anyio.sleep(1.0)  # the server has the call
                    await http.post(f"{second.base}/mcp/", headers=headers, json={
                        "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
                await http.delete(f"{first.base}/mcp/", headers=headers)

        anyio.run(main)
        settle_all((first, second))
    step = Step.objects.get(number=2)
    if bus:
        assert "cancelled" in ledger.read_text() and step.status == "cancelled"
        assert (
            step.error_message == "The agent cancelled the call while slow had it; the server may have acted."
        )
    else:
        assert "cancelled" not in ledger.read_text() and step.status == "ok"


@needs_redis
@pytest.mark.parametrize("bus", [True, False])
def test_what_a_server_says_outside_a_call_reaches_the_agent_on_the_stream_another_recorder_holds(
        transactional_db, settings, dana, bus):
    """The agent's GET stream is open at one Recorder and its calls go to another, whose upstream session
    hears the server's list change: the bus carries it to the stream. Without a bus, the agent hears only
    what the process holding its stream hears (the README's single-process default)."""
    settings.RECORDER_BUS_URL = REDIS_URL if bus else ""
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    with (
        ServerThread(handshake_server.build_app(), free_port()) as upstream,
        behind_a_balancer() as (_, (first, second), _),
    ):
        services.refresh_catalogue(
            server=services.register_tool_server(name="memo", url=f"{upstream.base}/mcp")
        )

        async def main():
            base = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
            heard = []
            async with httpx2.AsyncClient(headers=base, timeout=30) as http:
                opened = await http.post(f"{first.base}/mcp/", json=INITIALIZE)
                headers = session_headers(opened)
                await http.post(f"{first.base}/mcp/", headers=headers,
                                json={"jsonrpc": "2.0", "method": "notifications/initialized"})

                async def listen(task_status=anyio.TASK_STATUS_IGNORED):
                    async with http.stream("GET", f"{second.base}/mcp/", headers=headers) as stream:
                        task_status.started()
                        async for line in stream.aiter_lines():
                            if line.startswith("data:") and "list_changed" in line:
                                heard.append(json.loads(line[5:])["method"])

                async with anyio.create_task_group() as group:
                    await group.start(listen)
                    for _ in range(50):  # the stream is registered at the second Recorder
                        if second.app.recorder.relay.streams.holds_stream(headers["Mcp-Session-Id"]):
                            break
                        await anyio.sleep(0.05)
                    for n in range(2):
                        answer = await http.post(f"{first.base}/mcp/", headers=headers, json={
                            "jsonrpc": "2.0", "id": 10 + n, "method": "tools/call",
                            "params": {"name": "memo__announce", "arguments": {}}})
                        assert "announced" in answer.text
                    with anyio.move_on_after(3 if bus else 1.5):
                        while len(heard) < 2:
                            await anyio.sleep(0.05)
                    group.cancel_scope.cancel()
                await http.delete(f"{first.base}/mcp/", headers=headers)
            return heard

        heard = anyio.run(main)
        settle_all((first, second))
    assert heard == (["notifications/tools/list_changed"] * 2 if bus else [])


def test_requests_of_a_session_arriving_at_once_where_it_is_new_are_all_answered(recorders, dana):
    """The first requests of a session another Recorder opened, all at once: it is adopted once, and every
    one of them is answered (none finds the session half set up)."""
    _, (first, second), _ = recorders
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    opened = httpx2.post(f"{first.base}/mcp/", headers=headers, json=INITIALIZE)
    headers |= session_headers(opened)
    # The second Recorder has read the session's record (as it would for another request a moment ago),
    # so nothing slows the requests down before they reach the session.
    anyio.run(second.app.recorder.sessions.find, opened.headers["mcp-session-id"])

    async def at_once():
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            statuses = []

            async def one(n):
                answer = await http.post(
                    f"{second.base}/mcp/", json={"jsonrpc": "2.0", "id": n, "method": "tools/list"}
                )
                statuses.append(answer.status_code)

            async with anyio.create_task_group() as group:
                for n in range(1, 9):
                    group.start_soon(one, n)
            return statuses

    assert anyio.run(at_once) == [200] * 8


def test_a_session_the_database_cannot_record_is_not_opened(recorders, dana, monkeypatch):
    """If the new session cannot be written down, no Recorder could find it again: the agent is told, with
    a clear error of the Recorder's own, and given no session id."""
    from journal.mcp import sessions

    def down(*args):
        raise RuntimeError("database down")

    monkeypatch.setattr(sessions, "_write", down)
    _, (first, _), _ = recorders
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    opened = httpx2.post(f"{first.base}/mcp/", headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}, json=INITIALIZE)
    assert opened.status_code == 503 and "mcp-session-id" not in opened.headers
    error = opened.json()["error"]
    advice = error["data"].pop("_meta")["hatp/journal"]["recovery"]
    assert (
        error["data"] == {"source": "recorder", "reason": "unavailable"}
        and "nothing was opened" in error["message"]
    )
    assert advice["action"] == "backoff" and advice["retryable"] is True
    assert not AgentSession.objects.exists()
