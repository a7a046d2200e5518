"""The Recorder's hot path: plain `tools/call` requests on the stateless 2026-07-28 protocol, answered
without the SDK's per-request machinery, and the event stream a held call's answer turns into."""

import asyncio
import json
import logging
import time
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, encode_header_value
from mcp_types import LOG_LEVEL_META_KEY, PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from ..models import Agent
from .asgi import read_body
from .context import RUN_ID_HEADER

logger = logging.getLogger(__name__)


class FastCalls:
    """`tools/call` on the stateless 2026-07-28 protocol, answered without the SDK's per-request machinery.

    This is the Recorder's hot path: an agent's call costs one JSON parse, the journal and the upstream call.
    Only plain, well-formed requests take it (JSON in and out, no session, no progress token, no extra
    parameters, headers that agree with the body, within the body limit, passing the same host and origin
    checks). Everything else, including every malformed request, goes to the SDK, which answers it as it
    would have anyway. Replies are built with the SDK's own result sieve, error table and serverInfo stamp,
    so a client cannot tell which path answered.
    """

    def __init__(self, *, forward, not_delivered, sdk_app, server_info: dict[str, Any],
                 security: TransportSecuritySettings):
        """`forward` and `not_delivered` are the Recorder's (`gateway.Recorder`); `sdk_app` answers whatever
        does not take this path; `server_info` is the SDK's serverInfo stamp, read once: each reply is
        serialised at once, so one dict can serve all."""
        self.forward, self.not_delivered, self.sdk_app = forward, not_delivered, sdk_app
        self.server_info = server_info
        self.security = TransportSecurityMiddleware(security)
        self.answered = 0  # how many calls took this path (tests and the benchmark read it)

    def _candidate(self, scope) -> str | None:
        """The protocol version, when the headers alone allow the fast path."""
        if scope["method"] != "POST":
            return None
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
        version = headers.get("mcp-protocol-version", "")
        length = headers.get("content-length", "")
        if (
            headers.get("mcp-method") != "tools/call"
            or version not in MODERN_PROTOCOL_VERSIONS
            or "mcp-session-id" in headers
            or any(name.startswith("mcp-param-") for name in headers)
            or not headers.get("content-type", "").startswith("application/json")
            or "application/json" not in headers.get("accept", "")
            or not length.isdigit()
            or int(length) > DEFAULT_MAX_REQUEST_BODY_SIZE
        ):
            return None
        return version

    @staticmethod
    def _request(body: bytes, version: str, name_header: str | None) -> dict | None:
        try:
            request = json.loads(body)
        except ValueError:
            return None
        params = request.get("params") if isinstance(request, dict) else None
        if not isinstance(params, dict):
            return None
        meta = params.get("_meta")
        request_id = request.get("id")
        plain = (
            request.get("jsonrpc") == "2.0"
            and request.get("method") == "tools/call"
            and set(request) == {"jsonrpc", "id", "method", "params"}
            and (
                isinstance(request_id, str)
                or (isinstance(request_id, int) and not isinstance(request_id, bool))
            )
            and set(params) <= {"name", "arguments", "_meta"}
            and isinstance(params.get("name"), str)
            and name_header == encode_header_value(params["name"])
            and isinstance(params.get("arguments", {}), dict)
            and isinstance(meta, dict)
            and meta.get(PROTOCOL_VERSION_META_KEY) == version
            and "progressToken" not in meta
            and LOG_LEVEL_META_KEY not in meta  # its log messages ride the SDK's reply stream
        )
        return request if plain else None

    async def handle(self, agent: Agent, scope, receive, send) -> bool:
        """Answer the request and return True, or return False having consumed nothing."""
        version = self._candidate(scope)
        if version is None:
            return False
        body = await read_body(receive)
        headers = dict(scope.get("headers") or [])
        name_header = headers.get(b"mcp-name", b"").decode("latin-1") or None
        request = self._request(body, version, name_header)
        if request is None or await self.security.validate_request(Request(scope), is_post=True) is not None:
            # Hand the untouched body to the SDK, which gives the standard answer.
            replay = iter([{"type": "http.request", "body": body, "more_body": False}])

            async def replayed():
                return next(replay, None) or await receive()

            await self.sdk_app(scope, replayed, send)
            return True
        accept = headers.get(b"accept", b"").decode("latin-1")
        stream = _HeldStream(send) if "text/event-stream" in accept else None
        run_header = headers.get(RUN_ID_HEADER.encode(), b"").decode("latin-1") or None
        reply, status, journaled = await self._call(agent, request, version, receive, stream, run_header)
        if reply is None:  # the agent went away: nobody to answer
            return True
        self.answered += 1
        if journaled is not None:
            # The answer waits for its outcome's commit (grouped with whatever else is being written): an
            # agent is never told of a result that a Recorder killed a moment later would lose.
            await journaled
        if stream is not None and stream.open:
            await stream.finish(reply)
        else:
            await Response(json.dumps(reply, separators=(",", ":")), status_code=status,
                           media_type="application/json")(scope, receive, send)
        return True

    async def _call(self, agent: Agent, request: dict, version: str, receive, stream: "_HeldStream | None",
                    run_header: str | None = None):
        """Forward the call: (the JSON-RPC reply, its HTTP status, the outcome's journal write or None). The
        reply is None when the agent went away (the call is then journaled as cancelled or undelivered)."""
        params = request["params"]
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        journaled = None
        try:
            # On this protocol an agent cancels a call by closing its request's connection: the call is
            # then left (and journaled as cancelled), which closes the upstream request in turn.
            # This runs on every call, so the watching costs next to nothing until a call lasts: a timer,
            # which
            # only then starts a task that waits for the disconnect (a task group would cost ~0.1 ms a call).
            with anyio.CancelScope() as call:
                watching = _Watch(receive, call)
                try:
                    result, journaled = await self.forward(
                        agent=agent,
                        name=params["name"],
                        arguments=params.get("arguments"),
                        meta=params["_meta"],
                        session_id=None,
                        version=version,
                        progress=stream.keep_alive if stream else None,
                        run_header=run_header,
                        request_id=request["id"],
                    )
                finally:
                    watching.stop()  # answered (or failed)
            if call.cancelled_caught:  # the agent went away: the call was left and journaled
                return None, 200, None
            if journaled is not None and (watching.gone or _gone(receive)):
                # The server answered, but the agent left before it could have the answer.
                await self.not_delivered(journaled, "The agent went away before the Recorder could send "
                                                    "it the server's answer; the server acted.")
                return None, 200, None
            reply["result"] = self._wire(result, version)
        except MCPError as exc:
            reply["error"] = exc.error.model_dump(mode="json", by_alias=True, exclude_none=True)
            return reply, ERROR_CODE_HTTP_STATUS.get(exc.error.code, 200), journaled
        except ValidationError:
            logger.exception("a tools/call result did not fit the %s result schema", version)
            reply["error"] = {"code": -32603, "message": "Handler returned an invalid result"}
        except Exception:  # as the SDK does: log it, and never let internals reach the wire
            logger.exception("tools/call failed inside the Recorder")
            reply["error"] = {"code": -32603, "message": "Internal server error"}
        return reply, 200, journaled

    def _wire(self, result, version: str) -> dict[str, Any]:
        """The result as it goes out, with the SDK's serverInfo stamp."""
        if isinstance(result, types.CallToolResult):  # the Recorder's own tool error
            wire = _methods.serialize_server_result(
                "tools/call", version, result.model_dump(by_alias=True, mode="json", exclude_none=True))
        else:  # a server's answer, already shaped and sieved for this version by `forward`
            wire = result
        wire_meta = wire.get("_meta") if isinstance(wire.get("_meta"), dict) else {}
        if wire_meta.get(SERVER_INFO_META_KEY) is None:
            wire["_meta"] = {**wire_meta, SERVER_INFO_META_KEY: self.server_info}
        return wire


class _Watch:
    """Cancel `scope` when the agent's connection closes, watching only once the call has lasted `after`
    seconds (a quicker call is answered before a watcher could matter)."""

    after = 0.05

    def __init__(self, receive, scope: anyio.CancelScope):
        self.receive, self.scope, self.task = receive, scope, None
        self.gone = False  # the agent's connection closed
        self.timer = asyncio.get_running_loop().call_later(self.after, self._start)

    def _start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._until_disconnect())

    async def _until_disconnect(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.scope.cancel()

    def stop(self) -> None:
        self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


def _gone(receive) -> bool:
    """Whether the agent's connection has closed, without waiting and without a task: the request's body is
    read, so the only message left is the disconnect, which a closed connection has ready at once. The
    receive is driven one step by hand; if it would have to wait, it is closed instead (on every call, a
    cancel scope would cost more than the rest of the check)."""
    pending = receive()
    try:
        pending.send(None)
    except StopIteration as done:
        return isinstance(done.value, dict) and done.value.get("type") == "http.disconnect"
    pending.close()
    return False


HOLD_PING_SECONDS = 10.0  # SSE keep-alive comments while a held call waits, so no proxy or client gives up
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no")]


class _HeldStream:
    """A fast-path reply that turns into an event stream while a held call waits, as the SDK's own replies
    do: keep-alive comments (this path has no progress token, so no progress notifications), then the
    reply as one `message` event. A call that is not held never opens it and is answered with plain JSON."""

    def __init__(self, send):
        self.send = send
        self.open = False
        self.last_ping = 0.0

    async def keep_alive(self, done: float, total: float | None, message: str | None) -> None:
        now = time.monotonic()
        if not self.open:
            await self.send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            self.open = True
        elif now - self.last_ping < HOLD_PING_SECONDS:
            return
        self.last_ping = now
        await self.send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})

    async def finish(self, reply: dict[str, Any]) -> None:
        data = json.dumps(reply, separators=(",", ":"))
        await self.send(
            {
                "type": "http.response.body",
                "body": f"event: message\r\ndata: {data}\r\n\r\n".encode(),
                "more_body": False,
            }
        )

