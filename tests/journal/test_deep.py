"""Deep nesting (issue 14, finding 9): arguments nested 50,000 deep gave a plain-text HTTP 500 and 900 deep a
-32603 with nothing journaled; a result nested 5,000 deep left its step pending until the reconciler called
it "Recorder stopped", which was untrue. Now a request is refused before anything parses it, and a server's
answer is measured before the SDK reads it: the step says the server answered, with the answer's size and
SHA-256, and the agent gets a tool error."""

import json
import sys
from pathlib import Path

import httpx2 as httpx
import pytest

from journal import services
from journal.models import ChainEntry, Step
from journal.record import strict_json
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server, modern_server

from .helpers import run_agent

pytestmark = pytest.mark.django_db(transaction=True)

DEEP_STDIO = [
    sys.executable,
    str(Path(__file__).resolve().parent.parent / "fixtures" / "deep_stdio_server.py"),
]


@pytest.fixture
def token(dana):
    return services.create_agent(name="bot", on_behalf_of=dana)[1]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def post(recorder, token, body: bytes, *, modern: bool):
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json",
               "accept": "application/json, text/event-stream"}
    if modern:
        headers.update(
            {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "legacy__echo"}
        )
    return httpx.post(f"{recorder.base}/mcp/", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("depth", [900, 50_000])
@pytest.mark.parametrize("modern", [True, False], ids=["2026-07-28", "handshake"])
def test_arguments_nested_too_deep_get_a_json_rpc_error_and_nothing_is_journaled(
    recorder, token, depth, modern
):
    meta = '"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}, ' if modern else ""
    body = (f'{{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {{{meta}"name": "legacy__echo", '
            f'"arguments": {{"x": {nested(depth)}}}}}}}').encode()
    response = post(recorder, token, body, modern=modern)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert answer["id"] == 7 and answer["error"]["code"] == -32600
    assert f"nests {depth + 3} levels deep" in answer["error"]["message"]
    assert "Nothing was journaled or sent" in answer["error"]["message"]
    assert not Step.objects.exists() and not ChainEntry.objects.exists()


def test_a_request_with_no_id_nested_too_deep_is_a_bad_request(recorder, token):
    response = post(recorder, token, ("[" * 80 + "]" * 80).encode(), modern=False)
    assert response.status_code == 400 and response.json()["error"]["code"] == -32600
    assert response.json()["id"] is None


def test_arguments_at_the_limit_still_go_through(recorder, token, sample_servers):
    from .helpers import register_samples

    register_samples(sample_servers, names=("legacy",))
    value = {"x": json.loads(nested(strict_json.MAX_DEPTH - 1))}  # the arguments object is the 64th level

    async def script(client):
        return await client.call_tool("legacy__echo", value)

    result = run_agent(recorder, token, script)
    assert not result.is_error and Step.objects.get().status == "ok"


def deepening(inner, depth: int, *, events: bool):
    """`inner`, except that its tools/call answers are a result nested `depth` deep, as JSON or as an
    event."""

    async def app(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await inner(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        request = json.loads(body)
        if isinstance(request, dict) and request.get("method") == "tools/call":
            answer = (
                '{{"jsonrpc": "2.0", "id": {}, "result": {{"content": [{{"type": "text", "text": "deep"}}], '
                '"structuredContent": {{"v": {}}}}}}}'.format(json.dumps(request["id"]), nested(depth))
            ).encode()
            kind = b"text/event-stream" if events else b"application/json"
            wire = b"event: message\r\ndata: " + answer + b"\r\n\r\n" if events else answer
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
            return await send({"type": "http.response.body", "body": wire})
        replay = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def replayed():
            return next(replay, None) or await receive()

        await inner(scope, replayed, send)

    return app


@pytest.fixture
def deep_server(request, tmp_path):
    """A server named `deep` whose answer to any call nests 5,000 deep: on the stateless protocol (the
    Recorder's direct path), on the handshake with JSON or event streams (the SDK's path), or over stdio."""
    kind = request.param
    if kind == "stdio":
        services.refresh_catalogue(
            server=services.register_tool_server(name="deep", command=" ".join(DEEP_STDIO))
        )
        yield "deep__deep"
        return
    inner = modern_server.build_app() if kind == "stateless" else handshake_server.build_app(
        json_response=kind == "handshake-json")
    app = deepening(inner, 5000, events=kind != "handshake-json")
    with ServerThread(app, free_port()) as server:
        services.refresh_catalogue(
            server=services.register_tool_server(name="deep", url=f"{server.base}/mcp")
        )
        yield "deep__count" if kind == "stateless" else "deep__blob"


@pytest.mark.parametrize(
    "deep_server", ["stateless", "handshake-json", "handshake-sse", "stdio"], indirect=True
)
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_result_nested_too_deep_is_a_tool_error_and_the_step_says_the_server_answered(
        recorder, token, deep_server, mode):
    async def script(client):
        return await client.call_tool(deep_server, {"n": 1, "size": 1})

    result = run_agent(recorder, token, script, mode=mode)
    assert result.is_error
    said = result.content[0].text
    assert "nested 5003 levels deep" in said and f"limit of {strict_json.MESSAGE_MAX_DEPTH}" in said
    assert "may have acted" in said
    step = Step.objects.get()
    assert step.status == "undelivered" and step.result_storage == "dropped" and step.finished_at is not None
    assert "nested 5003 levels deep" in step.error_message
    assert step.result_size and len(step.result_sha256) == 64
    assert services.reconcile_stale_steps(older_than=step.finished_at.replace(year=2100)) == 0
    assert services.verify_run(run=step.run).ok
