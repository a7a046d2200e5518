"""Small ASGI helpers shared by the Recorder's own request handling."""

import json
import logging

from mcp.server.streamable_http import check_accept_headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..upstream.bounded import next_boundary
from .bus import Cancels
from .context import recorder_data
from .delivery import Deliveries, call_id, cancelled_id
from .sessions import SessionStore, record_of

logger = logging.getLogger(__name__)


async def read_body(receive) -> bytes:
    """The whole request body, however many messages it arrives in."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


_STREAM_ONLY_HEADERS = {
    b"content-type",
    b"content-length",
    b"cache-control",
    b"connection",
    b"x-accel-buffering",
}


def _event_data(event: bytes) -> tuple[bool, bytes]:
    """(whether the event is a comment only, its data) for one server-sent event."""
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    comment_only = all(not line or line.startswith(b":") for line in lines)
    return comment_only, b"\n".join(data)


# An agent's POST must accept both an event stream and JSON (MCP's streamable HTTP transport); the SDK refuses
# one that does not with an empty 406, which tells an agent's developer nothing.
NOT_ACCEPTABLE = {"jsonrpc": "2.0", "id": None, "error": {
    "code": -32600, "message": "Not Acceptable: the request's Accept header must list both application/json "
                               "and text/event-stream (MCP's streamable HTTP transport)."}}


class AnswerAsJson:
    """The SDK's server answers every POST with an event stream; an answer that is the stream's first
    event goes out instead as a plain JSON body, as the SDK's own JSON mode would send it. Clients cap the
    size of one event (the Python SDK's at 1 MiB), never of a JSON body, so this is how a large result
    reaches every client. A stream that carries anything before its answer (progress, a request of the
    server's, a keep-alive) stays a stream; a 2026-07-28 `subscriptions/listen` is never held back.
    How each call of a handshake session's ended, its answer sent or the agent gone first, goes to
    `deliveries`."""

    def __init__(self, app, deliveries: Deliveries | None = None, sessions: SessionStore | None = None,
                 cancels: Cancels | None = None):
        self.app, self.deliveries, self.sessions, self.cancels = app, deliveries, sessions, cancels

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or headers.get(b"mcp-method") == b"subscriptions/listen"
        ):
            return await self.app(scope, receive, send)
        if not all(check_accept_headers(Request(scope))):  # the SDK's 406 has no body: say why
            return await JSONResponse(NOT_ACCEPTABLE, status_code=406)(scope, receive, send)
        lazy = _LazyStream(send)
        session_id = headers.get(b"mcp-session-id")
        if (
            session_id is None
            and self.sessions is not None
            and headers.get(b"mcp-method", b"initialize") == b"initialize"
        ):
            # Perhaps an initialize: the session it opens is written down before the agent hears of it.
            watched = _Watched(receive, lazy)
            lazy.before_answer = lambda start, answer: self._opened(scope, watched, start, answer)
            await self.app(scope, watched.receive, lazy.send)
            return await lazy.flush(final=True)
        if session_id is None or self.deliveries is None:
            await self.app(scope, receive, lazy.send)
            return await lazy.flush(final=True)
        watched = _Watched(receive, lazy)
        try:
            await self.app(scope, watched.receive, lazy.send)
            await lazy.flush(final=True)
        finally:
            body = b"".join(watched.body)
            if (request_id := call_id(body)) is not None:
                await self.deliveries.finished(
                    session_id.decode("latin-1"), request_id, delivered=not watched.gone
                )
            elif self.cancels is not None and lazy.accepted and (cancelled := cancelled_id(body)) is not None:
                # Only a cancellation the session's own agent sent: another agent naming the session was
                # answered 404, and must not stop a call that is not its own.
                await self.cancels.cancelled(session_id.decode("latin-1"), cancelled)

    async def _opened(
        self, scope, watched: "_Watched", start: dict, answer: bytes
    ) -> tuple[int, bytes] | None:
        """Write down the session an `initialize` answer opens; if that fails, what to answer instead."""
        session_id = dict(start.get("headers") or []).get(b"mcp-session-id")
        agent = (scope.get("state") or {}).get("agent")
        if session_id is None or agent is None:
            return
        try:
            request, answered = json.loads(b"".join(watched.body)), json.loads(answer)
        except ValueError:
            return
        if not isinstance(request, dict) or request.get("method") != "initialize" \
                or (record := record_of(agent.pk, request, answered)) is None:
            return None
        try:
            await self.sessions.opened(session_id.decode("latin-1"), record)
        except Exception:  # the session would not be found again: so it is not opened
            logger.exception("could not write down a new agent session")
            return 503, json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": request.get("id"),
                    "error": {
                        "code": -32603,
                        "message": "The Recorder could not record the new session (its database did not "
                        "answer); nothing was opened. Try again.",
                        "data": recorder_data("unavailable"),
                    },
                }
            ).encode()
        return None


class _Watched:
    """A POST's receive, noting its body and whether the agent hung up before the response ended."""

    def __init__(self, receive, lazy: "_LazyStream"):
        self._receive, self.lazy = receive, lazy
        self.body: list[bytes] = []
        self.gone = False

    async def receive(self):
        message = await self._receive()
        if message["type"] == "http.request":
            self.body.append(message.get("body", b""))
        elif message["type"] == "http.disconnect" and not self.lazy.ended:
            self.gone = True
        return message


class _LazyStream:
    def __init__(self, send):
        self.downstream = send
        self.start: dict | None = None
        self.seen = bytearray()  # every byte of the stream so far, until it is decided
        self.scanned = 0
        self.mode = ""  # "" deciding, "stream" passing through, "answered" sent as JSON
        self.ended = False  # the response's last message went out
        self.accepted = False  # the app answered with a success status (2xx or 3xx)
        # Awaited with (the response's start, the answer) before the answer goes out; it may give
        # (status, body) to answer instead.
        self.before_answer = None

    async def _out(self, message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self.downstream(message)

    async def send(self, message) -> None:
        if self.mode == "stream":
            return await self._out(message)
        if self.mode == "answered":
            return None  # the stream's own end, after its answer went out as JSON
        if message["type"] == "http.response.start":
            self.accepted = message.get("status", 200) < 400
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if not content_type.startswith(b"text/event-stream"):
                self.mode = "stream"
                return await self._out(message)
            self.start = message
            return None
        self.seen += message.get("body", b"")
        while (end := next_boundary(self.seen[self.scanned:])) >= 0:
            event = bytes(self.seen[self.scanned:self.scanned + end])
            self.scanned += end
            comment_only, data = _event_data(event)
            if not data and not comment_only:
                continue  # an event with no data (a priming event id): nothing a JSON answer needs
            answer = _answer(data) if data else None
            if answer is None:
                return await self.flush(final=not message.get("more_body", False))
            self.mode = "answered"
            status, dropped = self.start["status"], _STREAM_ONLY_HEADERS
            if (
                self.before_answer is not None
                and (instead := await self.before_answer(self.start, answer)) is not None
            ):
                (status, answer), dropped = instead, _STREAM_ONLY_HEADERS | {b"mcp-session-id"}
            kept = [(name, value) for name, value in self.start["headers"] if name.lower() not in dropped]
            await self.downstream(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        *kept,
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(answer)).encode()),
                    ],
                }
            )
            return await self._out({"type": "http.response.body", "body": answer, "more_body": False})
        if not message.get("more_body", False):
            await self.flush(final=True)
        return None

    async def flush(self, *, final: bool) -> None:
        """Send the stream as it came (it carried something besides its answer, or ended without one)."""
        if self.mode or self.start is None:
            return
        self.mode = "stream"
        await self.downstream(self.start)
        await self._out({"type": "http.response.body", "body": bytes(self.seen), "more_body": not final})


def _answer(data: bytes) -> bytes | None:
    """`data` if it is a JSON-RPC response (a result or an error), else None."""
    try:
        message = json.loads(data)
    except ValueError:
        return None
    if isinstance(message, dict) and "id" in message and "method" not in message and (
            "result" in message or "error" in message):
        return data
    return None
