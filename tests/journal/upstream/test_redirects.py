"""A tool server that answers with a redirect is a failed call naming the target, never followed: a redirect
could point anywhere, the Recorder's own network included (a blind request forgery)."""

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from journal import services
from journal.models import Step
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server, modern_server

from ..helpers import run_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def internal():
    """A service only the Recorder's network reaches; it keeps every request it is sent."""
    hits = []

    async def anything(request: Request):
        hits.append((request.method, await request.body()))
        return JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {}})

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST", "DELETE"])])
    with ServerThread(app, free_port()) as thread:
        yield f"{thread.base}/admin/reset", hits


SAME_ORIGIN = "/internal/reset"  # a path on the tool server's own host: the SDK alone would follow it


def redirecting(inner, target: str, methods: set[str] | None, status: int = 307, hits: list | None = None):
    """`inner`, except that a POST of one of `methods` (every request, if None) is answered with a redirect
    to `target`; what reaches SAME_ORIGIN is kept in `hits`."""

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/internal"):
            hits.append((scope["method"], scope["path"]))
            return await JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {}})(scope, receive, send)
        if scope["type"] != "http" or scope["method"] != "POST":
            return await inner(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        if methods is None or method in methods:
            response = JSONResponse({"moved": True}, status_code=status, headers={"location": target})
            return await response(scope, receive, send)
        sent = False

        async def replayed():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await inner(scope, replayed, send)

    return app


@pytest.mark.parametrize("where", ["same-origin", "elsewhere"])
@pytest.mark.parametrize("status", [307, 302])
def test_a_catalogue_read_that_is_redirected_fails_naming_the_target_and_nothing_follows_it(
        transactional_db, internal, status, where):
    target, hits = internal if where == "elsewhere" else (SAME_ORIGIN, [])
    with ServerThread(
        redirecting(handshake_server.build_app(), target, None, status, hits), free_port()
    ) as shady:
        server = services.refresh_catalogue(
            server=services.register_tool_server(name="shady", url=f"{shady.base}/mcp")
        )
    assert f"answered HTTP {status}, a redirect to {target}" in server.catalogue_error
    assert "does not follow redirects" in server.catalogue_error
    assert hits == []


@pytest.mark.parametrize("where", ["same-origin", "elsewhere"])
@pytest.mark.parametrize("server_app", [handshake_server.build_app, modern_server.build_app],
                         ids=["2025-handshake-server", "2026-server"])
def test_a_call_answered_with_a_redirect_is_a_failed_call_naming_the_target(
        recorder, dana, internal, server_app, where):
    target, hits = internal if where == "elsewhere" else (SAME_ORIGIN, [])
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    with ServerThread(redirecting(server_app(), target, {"tools/call"}, 307, hits), free_port()) as shady:
        services.refresh_catalogue(
            server=services.register_tool_server(name="shady", url=f"{shady.base}/mcp")
        )

        async def script(client):
            return await client.call_tool("shady__announce", {})

        result = run_agent(recorder, token, script, mode="legacy")
    assert result.is_error
    text = result.content[0].text
    assert f"shady answered HTTP 307, a redirect to {target}" in text and "does not follow redirects" in text
    step = Step.objects.get(tool="announce")
    assert step.status == Step.Status.ERROR and target in step.error_message
    assert hits == []
