"""Small ASGI helpers shared by the Recorder's own request handling."""

import json

from .bounded import next_boundary


async def read_body(receive) -> bytes:
    """The whole request body, however many messages it arrives in."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


_STREAM_ONLY_HEADERS = {b"content-type", b"content-length", b"cache-control", b"connection", b"x-accel-buffering"}


def _event_data(event: bytes) -> tuple[bool, bytes]:
    """(whether the event is a comment only, its data) for one server-sent event."""
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    comment_only = all(not line or line.startswith(b":") for line in lines)
    return comment_only, b"\n".join(data)


class AnswerAsJson:
    """The SDK's server answers every POST with an event stream; an answer that is the stream's first
    event goes out instead as a plain JSON body, as the SDK's own JSON mode would send it. Clients cap the
    size of one event (the Python SDK's at 1 MiB), never of a JSON body, so this is how a large result
    reaches every client. A stream that carries anything before its answer (progress, a request of the
    server's, a keep-alive) stays a stream; a 2026-07-28 `subscriptions/listen` is never held back."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        if scope["type"] != "http" or scope["method"] != "POST" or headers.get(b"mcp-method") == b"subscriptions/listen":
            return await self.app(scope, receive, send)
        lazy = _LazyStream(send)
        await self.app(scope, receive, lazy.send)
        await lazy.flush(final=True)


class _LazyStream:
    def __init__(self, send):
        self.downstream = send
        self.start: dict | None = None
        self.seen = bytearray()  # every byte of the stream so far, until it is decided
        self.scanned = 0
        self.mode = ""  # "" deciding, "stream" passing through, "answered" sent as JSON

    async def send(self, message) -> None:
        if self.mode == "stream":
            return await self.downstream(message)
        if self.mode == "answered":
            return None  # the stream's own end, after its answer went out as JSON
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if not content_type.startswith(b"text/event-stream"):
                self.mode = "stream"
                return await self.downstream(message)
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
            kept = [(name, value) for name, value in self.start["headers"] if name.lower() not in _STREAM_ONLY_HEADERS]
            await self.downstream({"type": "http.response.start", "status": self.start["status"], "headers": [
                *kept, (b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
            return await self.downstream({"type": "http.response.body", "body": answer, "more_body": False})
        if not message.get("more_body", False):
            await self.flush(final=True)
        return None

    async def flush(self, *, final: bool) -> None:
        """Send the stream as it came (it carried something besides its answer, or ended without one)."""
        if self.mode or self.start is None:
            return
        self.mode = "stream"
        await self.downstream(self.start)
        await self.downstream({"type": "http.response.body", "body": bytes(self.seen), "more_body": not final})


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
