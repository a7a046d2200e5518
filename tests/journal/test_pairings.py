"""Every protocol pairing, through the Recorder: agents on the stateless 2026-07-28 protocol ("auto") and on
the 2025-11-25 handshake ("legacy"), against tool servers on either (the sample servers over streamable HTTP;
the npm reference server-everything over stdio, which speaks 2025-11-25; PyPI's mcp-server-time over stdio,
which speaks 2026-07-28). What the agent gets through the Recorder must equal what it gets directly, but for
the hop's own envelope, and every call is journaled once with the status the agent saw."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from journal import services
from journal.mcp import versions
from journal.models import Step
from tests.services import NODE_MODULES, needs_node

from .helpers import hang_up_after_sending, register_samples, run_agent, settle, without_advice

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = ["node", str(NODE_MODULES / "@modelcontextprotocol/server-everything/dist/index.js"), "stdio"]
TIME = [str(Path(sys.executable).parent / "mcp-server-time")]
MODES = ["auto", "legacy"]

# Tools whose answer depends only on their arguments, so a direct call and one through the Recorder agree.
CALLS = {
    "everything": [
        ("echo", {"message": "hi"}),
        ("get-sum", {"a": 1, "b": 2}),
        ("get-structured-content", {"location": "Chicago"}),
        ("get-tiny-image", {}),
        ("get-annotated-message", {"messageType": "success", "includeImage": True}),
        ("get-resource-links", {"count": 2}),
        ("get-sum", {"a": "not a number"}),
    ],
    "time": [
        (
            "convert_time",
            {"source_timezone": "Europe/London", "time": "09:30", "target_timezone": "Asia/Tokyo"},
        ),
        (
            "convert_time",
            {"source_timezone": "Nowhere/Else", "time": "09:30", "target_timezone": "Asia/Tokyo"},
        ),
    ],
    "legacy": [("echo", {"text": "hi"}), ("echo", {})],
}


def same(result) -> dict:
    """A result as compared: its own fields, without the envelope each hop stamps for itself."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    meta = versions.without_envelope(dumped.pop("_meta", None))
    return {**dumped, **({"_meta": meta} if meta else {})}


def call_directly(target, mode: str, calls) -> list:
    async def main():
        async with Client(target, mode=mode, cache=None) as client:
            return [same(await client.call_tool(tool, arguments)) for tool, arguments in calls]

    return anyio.run(main)


def rpc_error_through(recorder, token: str, mode: str, name: str, arguments: dict):
    """The JSON-RPC error an agent gets for this call through the Recorder."""
    async def script(client):
        with pytest.raises(MCPError) as failure:
            await client.call_tool(name, arguments)
        return failure.value.error

    return run_agent(recorder, token, script, mode=mode)


def call_through(recorder, token: str, mode: str, server: str, calls) -> list:
    async def script(client):
        return [same(await client.call_tool(f"{server}__{tool}", arguments)) for tool, arguments in calls]

    return run_agent(recorder, token, script, mode=mode)


@pytest.fixture
def token(dana):
    return services.create_agent(name="bot", on_behalf_of=dana)[1]


def stdio(argv):
    return StdioServerParameters(command=argv[0], args=argv[1:], env={"PATH": os.environ["PATH"]})


def assert_journaled(results, server: str):
    steps = list(Step.objects.filter(server_name=server).order_by("number").values_list("tool", "status"))
    assert steps == [(tool, "error" if result.get("isError") else "ok")
                     for (tool, _), result in zip(CALLS[server], results, strict=True)]


@needs_node
@pytest.mark.parametrize("mode", MODES)
def test_an_agent_on_either_protocol_reaches_a_2025_stdio_server_as_it_would_directly(recorder, token, mode):
    services.refresh_catalogue(
        server=services.register_tool_server(name="everything", command=" ".join(EVERYTHING))
    )
    direct = call_directly(stdio(EVERYTHING), mode, CALLS["everything"])
    assert without_advice(call_through(recorder, token, mode, "everything", CALLS["everything"])) == direct
    assert direct[0]["content"] == [{"type": "text", "text": "Echo: hi"}] and direct[-1]["isError"]
    assert_journaled(direct, "everything")


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_on_either_protocol_reaches_a_2026_stdio_server_as_it_would_directly(recorder, token, mode):
    services.refresh_catalogue(server=services.register_tool_server(name="time", command=" ".join(TIME)))
    direct = call_directly(stdio(TIME), mode, CALLS["time"])
    assert without_advice(call_through(recorder, token, mode, "time", CALLS["time"])) == direct
    assert "T18:30:00+09:00" in direct[0]["content"][0]["text"] and direct[1]["isError"]
    assert_journaled(direct, "time")


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_on_either_protocol_reaches_a_streamable_http_server_as_it_would_directly(
        recorder, sample_servers, token, mode):
    register_samples(sample_servers, names=("legacy",))

    async def direct_main():
        async with httpx2.AsyncClient(timeout=30) as http:
            async with Client(
                streamable_http_client(sample_servers.url("legacy"), http_client=http), mode=mode, cache=None
            ) as client:
                return [same(await client.call_tool(tool, arguments)) for tool, arguments in CALLS["legacy"]]

    direct = anyio.run(direct_main)
    assert without_advice(call_through(recorder, token, mode, "legacy", CALLS["legacy"])) == direct
    assert_journaled(direct, "legacy")


@pytest.mark.parametrize("mode", MODES)
def test_an_upstream_json_rpc_error_arrives_verbatim(recorder, sample_servers, token, mode):
    register_samples(sample_servers, names=("crm",))
    sample_servers.set_mode("crm", "rpc_error")
    error = rpc_error_through(recorder, token, mode, "crm__get_deal", {"deal_id": "D-881"})
    assert (error.code, error.message, error.data) == (
        -32602, "Invalid params for get_deal", {"field": "arguments", "tool": "get_deal"})


def test_an_answer_the_agents_protocol_cannot_carry_is_journaled_as_undelivered(
    recorder, sample_servers, token
):
    """A 2026 server asks for more input (`input_required`); a 2025 agent has no way to read that. The agent
    gets an error of the Recorder's own (its `data` says so), and the journal says the answer was not
    delivered, keeping what the server sent."""
    register_samples(sample_servers, names=("legacy",))
    sample_servers.set_mode("legacy", "input_required")
    error = rpc_error_through(recorder, token, "legacy", "legacy__echo", {"text": "hi"})
    advice = error.data.pop("_meta")["hatp/journal"]["recovery"]
    assert error.code == -32603 and error.data == {"source": "recorder", "reason": "undelivered"}
    assert advice["action"] == "ask_user" and "answer could not be relayed" in advice["why"]
    assert "cannot be delivered" in error.message and "'input_required'" in error.message
    step = Step.objects.get()
    assert step.status == "undelivered" and step.error_message == error.message
    assert step.result == {"resultType": "input_required", "requestState": "ask-again:echo"}
    assert step.run.failed_count == 1
    result = step.run.entries.get(event="result").data
    assert (result["status"], result["error"]) == ("undelivered", error.message)


@needs_node
@pytest.mark.parametrize("mode", MODES)
def test_the_servers_progress_reaches_the_agent_on_its_own_token(recorder, token, mode):
    services.refresh_catalogue(
        server=services.register_tool_server(name="everything", command=" ".join(EVERYTHING))
    )
    call = ("trigger-long-running-operation", {"duration": 1, "steps": 3})

    def collecting(seen):
        async def progress(done, total, message):
            seen.append((done, total, message))
        return progress

    async def direct_main(seen):
        async with Client(stdio(EVERYTHING), mode=mode, cache=None) as client:
            return same(await client.call_tool(*call, progress_callback=collecting(seen)))

    async def script(client, seen):
        return same(
            await client.call_tool(f"everything__{call[0]}", call[1], progress_callback=collecting(seen))
        )

    direct_seen, through_seen = [], []
    direct = anyio.run(direct_main, direct_seen)
    assert run_agent(recorder, token, lambda client: script(client, through_seen), mode=mode) == direct
    assert through_seen == direct_seen == [(1.0, 3.0, None), (2.0, 3.0, None), (3.0, 3.0, None)]
    step = Step.objects.get()
    assert step.status == "ok" and "progressToken" not in (step.request_meta or {}) \
        and "progress_token" not in (step.request_meta or {})


SLOW = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "slow_stdio_server.py")]


@pytest.mark.parametrize("mode", MODES)
def test_an_agents_cancellation_reaches_the_server_and_the_step_says_it_was_cancelled(
    recorder, token, mode, tmp_path
):
    """notifications/cancelled on the handshake, the request's connection closing on 2026-07-28: either way
    the Recorder leaves the upstream call at once (the server is told), and journals the step as cancelled
    while the server had it, so it may have acted; the reconciler never has to guess."""
    ledger = tmp_path / "ledger"
    services.refresh_catalogue(
        server=services.register_tool_server(name="slow", command=" ".join([*SLOW, str(ledger)]))
    )
    ledger.unlink()  # reading the catalogue started (and stopped) a process of its own

    async def script(client):
        assert (await client.call_tool("slow__wait", {"seconds": 0})).content[0].text == "waited 0.0 s"
        with anyio.move_on_after(1.5):
            await client.call_tool("slow__wait", {"seconds": 30})
            raise AssertionError("the call was not cancelled")
        for _ in range(50):  # the server writes it down as its call is cancelled
            if "cancelled" in ledger.read_text():
                return ledger.read_text()
            await anyio.sleep(0.1)

    assert run_agent(recorder, token, script, mode=mode) == "started\ncancelled\n"
    first, second = Step.objects.order_by("number")
    assert first.status == "ok" and second.status == "cancelled"
    assert (
        second.error_message == "The agent cancelled the call while slow had it; the server may have acted."
    )
    assert second.reversibility == "unknown" and "may or may not have acted" in second.undo_problems[0]
    assert second.run.entries.filter(event="result", data__status="cancelled").count() == 1


def ts_client(target: str, token: str, calls) -> dict:
    """The official TypeScript SDK's client (tests/conformance/ts_client.mjs) making `calls`; each result
    without the envelope its hop stamps."""
    script = NODE_MODULES.parent / "ts_client.mjs"
    done = subprocess.run(
        ["node", str(script), target, token, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(done.stdout)
    for result in answer["results"]:
        meta = versions.without_envelope(result.pop("_meta", None))
        if meta:
            result["_meta"] = meta
    return answer


@needs_node
def test_the_typescript_sdks_client_gets_through_the_recorder_what_it_gets_directly(
    recorder, sample_servers, token
):
    register_samples(sample_servers, names=("legacy",))
    services.refresh_catalogue(
        server=services.register_tool_server(name="everything", command=" ".join(EVERYTHING))
    )
    direct_everything = ts_client("stdio:" + " ".join(EVERYTHING), "", CALLS["everything"])
    direct_legacy = ts_client(sample_servers.url("legacy"), "", CALLS["legacy"])
    through = ts_client(f"{recorder.base}/mcp/", token, [
        *([f"everything__{tool}", arguments] for tool, arguments in CALLS["everything"]),
        *([f"legacy__{tool}", arguments] for tool, arguments in CALLS["legacy"])])
    assert without_advice(through["results"]) == direct_everything["results"] + direct_legacy["results"]
    assert through["protocolVersion"] == direct_legacy["protocolVersion"] == "2025-11-25"
    assert direct_everything["results"][0]["content"] == [{"type": "text", "text": "Echo: hi"}]
    assert Step.objects.count() == len(CALLS["everything"]) + len(CALLS["legacy"])


def test_replacing_a_stdio_servers_command_stops_its_old_process(recorder, token, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    server = services.refresh_catalogue(server=services.register_tool_server(
        name="slow", command=" ".join([*SLOW, str(old)])))
    old.unlink()  # reading the catalogue started (and stopped) a process of its own

    async def call(client):
        return (await client.call_tool("slow__wait", {"seconds": 0})).content[0].text

    assert run_agent(recorder, token, call) == "waited 0.0 s"
    assert old.read_text() == "started\n"
    services.save_tool_server(server=server, command=" ".join([*SLOW, str(new)]))
    assert run_agent(recorder, token, call) == "waited 0.0 s"
    for _ in range(50):
        if "stopped" in old.read_text():
            break
        anyio.run(anyio.sleep, 0.1)
    assert old.read_text() == "started\nstopped\n" and new.read_text() == "started\n"


def test_a_call_cancelled_before_it_reached_the_server_says_nothing_was_sent(recorder, token, tmp_path):
    """The agent gives up while the Recorder is still starting the server's process: the call never left,
    so the step says so, and there is nothing to undo."""
    ledger = tmp_path / "ledger"
    services.refresh_catalogue(
        server=services.register_tool_server(name="slow", command=" ".join([*SLOW, str(ledger)]))
    )

    async def script(client):
        with anyio.move_on_after(0.2):  # the server's process takes about a second to start
            await client.call_tool("slow__wait", {"seconds": 0})
            raise AssertionError("the call was not cancelled")
        await anyio.sleep(1.5)  # still connected while the Recorder answers the cancelled request

    run_agent(recorder, token, script, mode="legacy")
    for _ in range(100):
        step = Step.objects.get()
        if step.status != "pending":
            break
        time.sleep(0.05)
        settle(recorder)
    assert step.status == "cancelled" and step.reversibility == "read_only" and not step.undo_problems
    assert step.error_message == "The agent cancelled the call before it was sent to slow; nothing was sent."
    assert step.run.unknown_count == 0


def test_a_call_cancelled_while_its_intent_is_journaled_is_closed_as_never_sent(
    recorder, sample_servers, token, monkeypatch
):
    """The agent gives up while the journal is still writing the call's intent (a busy journal): the step it
    opened is closed as cancelled with nothing sent, never left pending for the reconciler to guess about."""
    from journal.mcp import opening

    register_samples(sample_servers, names=("legacy",))
    slowly = opening.gated_step

    def busy_journal(**kwargs):
        time.sleep(0.6)
        return slowly(**kwargs)

    monkeypatch.setattr(opening, "gated_step", busy_journal)

    async def script(client):
        with anyio.move_on_after(0.2):
            await client.call_tool("legacy__echo", {})
            raise AssertionError("the call was not cancelled")
        await anyio.sleep(1.0)

    run_agent(recorder, token, script, mode="legacy")
    settle(recorder)
    settle(recorder)
    step = Step.objects.get()
    assert step.status == "cancelled" and not step.undo_problems
    assert step.error_message == (
        "The agent cancelled the call before it was sent to legacy; nothing was sent.")
    assert step.run.unknown_count == 0


@pytest.mark.postgres  # on PostgreSQL the outcome goes through the one statement
def test_an_answer_the_agent_left_before_getting_is_journaled_as_undelivered(recorder, sample_servers, token):
    """A 2026 agent sends its call and closes the connection at once: the server acts and answers, but nobody
    is there to get it. The step says the answer was not delivered, and keeps it."""
    register_samples(sample_servers, names=("legacy",))
    call_through(recorder, token, "auto", "legacy", [("echo", {})])  # the Recorder's session with it is open
    sample_servers.set_mode(
        "legacy", "normal", delay_ms=20
    )  # answered before the Recorder watches for a hang-up
    hang_up_after_sending(recorder.port, token, "legacy__create_ticket", {"title": "left"})
    for _ in range(100):
        step = Step.objects.filter(tool="create_ticket").exclude(status="pending").first()
        if step is not None and step.status != "ok":
            break
        time.sleep(0.05)
    assert step.status == "undelivered" and "went away" in step.error_message
    assert step.result["structuredContent"]["ticket"].startswith("T-")  # the server acted: its answer is kept
    assert step.run.entries.filter(event="undelivered", data__step=step.number).count() == 1
    assert [e["op"] for e in sample_servers.ledger("legacy")] == ["create_ticket"]
    assert services.verify_run(run=step.run).ok


def asking_for_a_name(sample_servers):
    register_samples(sample_servers, names=("legacy",))
    sample_servers.set_mode("legacy", "ask_name")
    asked = []

    async def elicit(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    return asked, elicit


@pytest.mark.parametrize("mode", MODES)
def test_a_server_that_asks_for_more_input_gets_the_agents_answer_on_either_protocol(
    recorder, sample_servers, token, mode
):
    """A 2026 server answers `input_required` with an elicitation. A 2026 agent gets that result and calls
    again with its answer, which reaches the server as sent; an agent on the handshake is asked the
    elicitation itself, and the Recorder calls again with its answer. Either way the agent is greeted."""
    asked, elicit = asking_for_a_name(sample_servers)

    async def script(client):
        return (await client.call_tool("legacy__echo", {})).content[0].text

    assert run_agent(recorder, token, script, mode=mode, elicitation_callback=elicit) == "Hello Ada"
    assert asked == ["Who is asking?"]
    assert [e["name"] for e in sample_servers.ledger("legacy") if e["op"] == "greeted"] == ["Ada"]
    steps = list(Step.objects.order_by("number"))
    if mode == "auto":  # the agent called twice: the first call did nothing but ask
        assert [(s.status, s.reversibility) for s in steps] == [("ok", "read_only"), ("ok", "unknown")]
    else:  # the Recorder asked the agent and called again, within the agent's one call
        assert [(s.status, s.reversibility) for s in steps] == [("ok", "unknown")]
        relayed = steps[0].run.entries.get(event="relayed").data
        assert (relayed["method"], relayed["answer"]["content"]) == ("elicitation/create", {"name": "Ada"})


@pytest.mark.parametrize("mode", MODES)
def test_a_stateless_server_is_told_each_call_what_the_agent_can_answer(
    recorder, sample_servers, token, mode
):
    """The sample server asks only a client that declared elicitation, as the protocol has it: through the
    Recorder's one shared connection it learns, call by call, what each agent declared."""
    asking_for_a_name(sample_servers)

    async def script(client):
        return (await client.call_tool("legacy__echo", {})).content[0].text

    assert run_agent(recorder, token, script, mode=mode) == \
        "This tool asks who is calling: it needs a client that can answer (elicitation)."
    assert Step.objects.get().status == "error"


@pytest.mark.parametrize("delay_ms", [20, 800])
def test_an_answer_a_handshake_agent_left_before_getting_is_journaled_as_undelivered(
    recorder, sample_servers, token, delay_ms
):
    """The same on the handshake: the agent's session is open, it posts a call and hangs up at once, before
    the server answers or while the answer is on its way. Hanging up is not cancelling on the handshake
    (that takes `notifications/cancelled`), so the server acts, and the step says its answer went nowhere."""
    register_samples(sample_servers, names=("legacy",))
    call_through(recorder, token, "legacy", "legacy", [("echo", {})])
    sample_servers.set_mode("legacy", "normal", delay_ms=delay_ms)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    url = f"http://127.0.0.1:{recorder.port}/mcp/"
    with httpx2.Client(headers=headers) as http:
        opened = http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            },
        )
        session = opened.headers["mcp-session-id"]
        http.post(url, headers={"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"},
                  json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "legacy__create_ticket", "arguments": {"title": "left"}}}).encode()
        head = (f"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1:{recorder.port}\r\nAuthorization: Bearer {token}\r\n"
                "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
                f"Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", recorder.port)) as raw:
            raw.sendall(head + body)
        for _ in range(100):
            step = Step.objects.filter(tool="create_ticket").exclude(status="pending").first()
            if step is not None and step.status != "ok":
                break
            time.sleep(0.05)
    assert step.status == "undelivered" and "went away" in step.error_message
    assert step.result["structuredContent"]["ticket"].startswith("T-")
    assert step.run.entries.filter(event="undelivered", data__step=step.number).count() == 1


@needs_node
def test_the_typescript_sdks_client_gets_progress_and_cancels_through_the_recorder(recorder, token, tmp_path):
    """The official TypeScript SDK's client (on the handshake) asks for progress and gets the server's on
    its own token; it cancels a call (`notifications/cancelled`), the server is told and the step says so."""
    services.refresh_catalogue(
        server=services.register_tool_server(name="everything", command=" ".join(EVERYTHING))
    )
    ledger = tmp_path / "ledger"
    services.refresh_catalogue(
        server=services.register_tool_server(name="slow", command=" ".join([*SLOW, str(ledger)]))
    )
    ledger.unlink()
    long_running = {"name": "trigger-long-running-operation", "arguments": {"duration": 1, "steps": 3}}
    direct = ts_client("stdio:" + " ".join(EVERYTHING), "", [["#progress", long_running]])["results"][0]
    through = ts_client(f"{recorder.base}/mcp/", token, [
        ["#progress", {**long_running, "name": "everything__trigger-long-running-operation"}],
        ["slow__wait", {"seconds": 0}],
        ["#cancel", {"name": "slow__wait", "arguments": {"seconds": 30}, "afterMs": 1500}]])["results"]
    # Directly, the last notification may come after the answer, which the TypeScript client then drops.
    assert through[0]["progress"] == [[1, 3, None], [2, 3, None], [3, 3, None]]
    assert direct["progress"] == through[0]["progress"][:len(direct["progress"])]
    assert through[0]["result"] == direct["result"]
    assert through[2]["cancelled"] and "abort" in through[2]["cancelled"].lower()
    for _ in range(50):  # the server writes it down as its call is cancelled
        if "cancelled" in ledger.read_text():
            break
        time.sleep(0.1)
    settle(recorder)
    assert ledger.read_text() == "started\ncancelled\n"
    steps = list(Step.objects.order_by("number").values_list("tool", "status", "error_message"))
    assert steps == [("trigger-long-running-operation", "ok", ""), ("wait", "ok", ""), (
        "wait", "cancelled", "The agent cancelled the call while slow had it; the server may have acted.")]
