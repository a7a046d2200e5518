"""All sample servers in one ASGI app: `/<name>/mcp` (MCP, streamable HTTP), `/<name>/ledger`,
`/<name>/control`, and the CRM's colleague door. Run it with `python -m samples`."""

import contextlib
import json
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.responses import Response as PlainText
from starlette.routing import Mount, Route

from .base import SampleServer, local_transport_security
from .servers import ALL


class PutBackRecovery:
    """The SDK sieves every result through its own schema and drops `annotations.recovery` (SEP-3172) from
    `tools/list`; this wrapper puts the declared value back into the JSON response on the wire."""

    def __init__(self, app, server: SampleServer):
        self.app = app
        self.server = server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = self._restore(b"".join(chunks), start)
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, capture)

    def _restore(self, body: bytes, start: dict[str, Any]) -> bytes:
        content_type = dict(start.get("headers", [])).get(b"content-type", b"")
        if not content_type.startswith(b"application/json"):
            return body
        try:
            message = json.loads(body)
        except ValueError:
            return body
        tools = message.get("result", {}).get("tools") if isinstance(message, dict) else None
        if not isinstance(tools, list):
            return body
        declared = {t["name"]: t["annotations"]["recovery"] for t in self.server.tools()
                    if "recovery" in t.get("annotations", {})}
        for tool in tools:
            if tool.get("name") in declared:
                tool.setdefault("annotations", {})["recovery"] = declared[tool["name"]]
        return json.dumps(message).encode()


class Faults:
    """Misbehaviour on demand, set through `/<name>/control`: answer 5xx, answer garbage, answer a result
    that is not an MCP tool result ("lie"), never answer, or act on a tool call and then never answer
    ("act_then_hang": the lost answer, after which nobody knows whether the server acted). Asking for more
    input ("input_required", "ask_name") is a 2026-07-28 server's: it speaks only that protocol then."""

    def __init__(self, app, server: SampleServer):
        self.app = app
        self.server = server

    async def __call__(self, scope, receive, send):
        mode = self.server.mode
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/mcp"):
            return await self.app(scope, receive, send)
        if mode == "error_5xx":
            return await PlainText("upstream exploded", status_code=502)(scope, receive, send)
        if mode == "garbage":
            return await PlainText("{not json at all", media_type="application/json")(scope, receive, send)
        if mode == "hang":
            await anyio.sleep(3600)
        if mode in ("lie", "act_then_hang"):
            return await self._tool_calls_only(mode, scope, receive, send)
        if mode in ("input_required", "ask_name"):  # a server of the stateless protocol only
            return await self._no_handshake(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _no_handshake(self, scope, receive, send):
        """Answer `initialize` as a server that speaks only the stateless 2026-07-28 protocol does: it has no
        such method. Everything else goes to the server."""
        body, replayed = await _read(receive)
        request = json.loads(body) if body else {}
        if isinstance(request, dict) and request.get("method") == "initialize":
            refused = {"jsonrpc": "2.0", "id": request.get("id"),
                       "error": {"code": -32601, "message": "Method not found: initialize"}}
            return await PlainText(json.dumps(refused), media_type="application/json")(scope, receive, send)
        return await self.app(scope, replayed, send)

    async def _tool_calls_only(self, mode, scope, receive, send):
        """Misbehave on tools/call only (the session opens normally). "lie": answer well-formed JSON-RPC whose
        result is not an MCP tool result. "act_then_hang": let the server act, then never answer."""
        body, replayed = await _read(receive)
        request = json.loads(body)
        if request.get("method") != "tools/call":
            return await self.app(scope, replayed, send)
        if mode == "act_then_hang":
            async def swallow(message):
                pass

            await self.app(scope, replayed, swallow)
            await anyio.sleep(3600)
        lie = {"jsonrpc": "2.0", "id": request.get("id"), "result": {"content": 5, "isError": "no"}}
        return await PlainText(json.dumps(lie), media_type="application/json")(scope, receive, send)


async def _read(receive):
    """A request's whole body, and a `receive` that gives it again (then the connection's own messages)."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    replay = iter([{"type": "http.request", "body": body, "more_body": False}])
    return body, lambda: _next(replay, receive)


async def _next(replay, receive):
    try:
        return next(replay)
    except StopIteration:
        return await receive()


def build_app(state_dir: Path | None) -> tuple[Starlette, dict[str, SampleServer]]:
    servers = {cls.name: cls(state_dir) for cls in ALL}
    subapps = []
    routes = []
    for name, server in servers.items():
        sub = server.mcp_server().streamable_http_app(
            streamable_http_path="/mcp",
            json_response=True,
            transport_security=local_transport_security(),
            custom_starlette_routes=[
                Route("/ledger", server.ledger, methods=["GET"]),
                Route("/control", server.control, methods=["POST"]),
                *server.colleague_routes(),
            ],
        )
        subapps.append(sub)
        asgi = Faults(PutBackRecovery(sub, server) if name == "payments" else sub, server)
        routes.append(Mount(f"/{name}", app=asgi))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with contextlib.AsyncExitStack() as stack:
            for sub in subapps:
                await stack.enter_async_context(sub.router.lifespan_context(sub))
            yield

    return Starlette(routes=routes, lifespan=lifespan), servers
