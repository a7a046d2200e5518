"""Answers of bounded size: no tool server's answer longer than the Recorder's limit reaches the SDK, the
journal or the agent, and what it was (its size and SHA-256, as the server sent it) is still known.

An answer over the limit is read to its end, hashed and dropped as it arrives, so the process never holds
more than the limit of it. On the SDK's HTTP path (`BoundedTransport`) and over stdio (`stdio`) the answer
is then replaced by a
JSON-RPC error naming a token only this process issued, which `Tokens.taken_from` turns back into the
size and digest: a server cannot fake one. The direct path reads a JSON answer with `read_bounded` and an
event stream with `events_bounded`.
"""

import hashlib
import json
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
from mcp import MCPError

from ..record import strict_json
from ..telemetry import tracing

CHUNK = 1 << 16
TOKEN_KEY = "oversizedAnswer"
_BOUNDARIES = (b"\r\n\r\n", b"\n\n", b"\r\r")  # the blank line that ends a server-sent event
_KEPT_TOKENS = 256


@dataclass(frozen=True)
class Oversized:
    """An answer over `limit` bytes, or (`depth`) nested deeper than MESSAGE_MAX_DEPTH: `size` and `sha256`
    of the bytes the server sent."""

    size: int
    sha256: str
    limit: int
    depth: int = 0

    def __str__(self) -> str:
        if self.depth:
            return f"JSON nested {self.depth} levels deep, over the limit of {strict_json.MESSAGE_MAX_DEPTH}"
        return f"{self.size} bytes, over the limit of {self.limit}"


def too_deep(data: bytes | bytearray, limit: int) -> "Oversized | None":
    """What an answer within the size limit was, when it nests deeper than any value the Recorder keeps
    (parsing it would exhaust Python's stack in the SDK, the journal or the agent's client)."""
    depth = strict_json.deeper_than(data, strict_json.MESSAGE_MAX_DEPTH)
    return None if depth is None else Oversized(len(data), hashlib.sha256(data).hexdigest(), limit, depth)


class _Measure:
    """Counts and hashes bytes, keeping them only while they are within the limit."""

    def __init__(self, limit: int):
        self.limit, self.size, self.digest, self.kept = limit, 0, hashlib.sha256(), bytearray()

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.digest.update(chunk)
        if self.size <= self.limit:
            self.kept += chunk
        else:
            self.kept.clear()

    @property
    def over(self) -> bool:
        return self.size > self.limit

    def oversized(self) -> Oversized:
        return Oversized(self.size, self.digest.hexdigest(), self.limit)


async def read_bounded(chunks, limit: int) -> bytes | Oversized:
    """The whole body, or what it was if it runs over `limit` bytes (read to its end, never held)."""
    measure = _Measure(limit)
    async for chunk in chunks:
        measure.add(chunk)
    return measure.oversized() if measure.over else (too_deep(measure.kept, limit) or bytes(measure.kept))


async def events_bounded(chunks, limit: int):
    """Each server-sent event of a stream, as its bytes (blank line included), or an `Oversized` in place of
    an event over `limit` bytes (read to its blank line, never held). A last event without its blank line
    is passed on as it is."""
    pending = bytearray()  # the event being read, while it is within the limit
    measure: _Measure | None = None  # the event being read, once it is over
    tail = b""  # the last bytes of an oversized event, to find its blank line across chunks
    async for chunk in chunks:
        if measure is not None:
            window = tail + chunk
            end = next_boundary(window)
            if end < 0:
                measure.add(chunk)
                tail = window[-3:]
                continue
            measure.add(window[len(tail):end])
            yield measure.oversized()
            measure, tail, chunk = None, b"", window[end:]
        pending += chunk
        while (end := next_boundary(pending)) >= 0:
            yield too_deep(pending[:end], limit) or bytes(pending[:end])
            del pending[:end]
        if len(pending) > limit:
            measure = _Measure(limit)
            measure.add(bytes(pending))
            tail = bytes(pending[-3:])
            pending.clear()
    if measure is not None:
        yield measure.oversized()
    elif pending:
        yield too_deep(pending, limit) or bytes(pending)


def _request_id(request: httpx.Request) -> Any:
    try:
        message = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError, TypeError):
        return None
    return message.get("id") if isinstance(message, dict) else None


def _trace_header(request: httpx.Request) -> None:
    """The request's trace context (in its `_meta`, where the SDK's client puts it: the MCP conventions'
    place) as a `traceparent` header too, for proxies and servers that read only headers."""
    try:
        message = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError, TypeError):
        return
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("traceparent"), str):
        request.headers["traceparent"] = meta["traceparent"]
        if isinstance(meta.get("tracestate"), str):
            request.headers["tracestate"] = meta["tracestate"]


def next_boundary(buffer: bytes | bytearray) -> int:
    """Where the first complete event in `buffer` ends (after its blank line), or -1."""
    ends = [found + len(mark) for mark in _BOUNDARIES if (found := buffer.find(mark)) >= 0]
    return min(ends) if ends else -1


@dataclass(frozen=True)
class Redirected:
    """A tool server answered with a redirect, which the Recorder never follows (it could point anywhere,
    the Recorder's own network included)."""

    status: int
    location: str

    def message(self, server: str) -> str:
        return (
            f"{server} answered HTTP {self.status}, a redirect to {self.location or '(no location)'}; the "
            "Recorder does not follow redirects from tool servers (register the server at its final URL)"
        )


class Tokens:
    """The answers this process replaced (oversized, or redirects), by the token each replacement carries."""

    def __init__(self, limit: int):
        self.limit = limit
        self._replaced: OrderedDict[str, Oversized | Redirected] = OrderedDict()

    def taken_from(self, error: MCPError) -> "Oversized | Redirected | None":
        data = error.error.data
        token = data.get(TOKEN_KEY) if isinstance(data, dict) else None
        return self._replaced.pop(token, None) if isinstance(token, str) else None

    def replacement(self, request_id: Any, replaced: "Oversized | Redirected") -> bytes:
        """The JSON-RPC error that stands for an answer to `request_id` over the limit, or a redirect."""
        token = secrets.token_hex(12)
        self._replaced[token] = replaced
        while len(self._replaced) > _KEPT_TOKENS:
            self._replaced.popitem(last=False)
        message = replaced.message("The server") if isinstance(replaced, Redirected) else \
            f"The answer was {replaced}"
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {
            "code": -32603, "message": message, "data": {TOKEN_KEY: token}}}).encode()


class BoundedTransport(httpx.AsyncBaseTransport):
    """The SDK's HTTP transport, with every POST's answer bounded: a JSON body, or one server-sent event,
    over `limit` bytes is replaced by a JSON-RPC error for the request that carries a token of this
    transport's; `tokens.taken_from(error)` gives what the answer was."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int, tokens: Tokens | None = None):
        self.inner, self.limit = inner, limit
        self.tokens = tokens or Tokens(limit)

    async def __aenter__(self):
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.inner.__aexit__(*exc_info)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if tracing.on() and request.method == "POST":
            _trace_header(request)
        response = await self.inner.handle_async_request(request)
        if 300 <= response.status_code < 400:  # never followed, whatever the SDK above would do with it
            await response.aclose()
            redirected = Redirected(response.status_code, response.headers.get("location", ""))
            request_id = _request_id(request) if request.method == "POST" else None
            if request_id is None:
                return httpx.Response(502, text=redirected.message("The server"), request=request)
            return httpx.Response(200, headers={"content-type": "application/json"}, request=request,
                                  content=self.tokens.replacement(request_id, redirected))
        content_type = response.headers.get("content-type", "")
        if request.method != "POST":
            return response
        if content_type.startswith("application/json"):
            stream: httpx.AsyncByteStream = _JsonBody(self, response.stream, _request_id(request))
        elif content_type.startswith("text/event-stream"):
            stream = _EventsBody(self, response.stream, _request_id(request))
        else:
            return response
        headers = [(name, value) for name, value in response.headers.raw if name.lower() != b"content-length"]
        return httpx.Response(
            response.status_code, headers=headers, stream=stream, extensions=response.extensions
        )


class _JsonBody(httpx.AsyncByteStream):
    def __init__(self, transport: BoundedTransport, inner, request_id: Any):
        self.transport, self.inner, self.request_id = transport, inner, request_id

    async def __aiter__(self):
        body = await read_bounded(self.inner, self.transport.limit)
        yield (
            self.transport.tokens.replacement(self.request_id, body) if isinstance(body, Oversized) else body
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


class _EventsBody(httpx.AsyncByteStream):
    """Server-sent events passed on one at a time; an event over the limit is read to its blank line,
    hashed and replaced by an error event for the request."""

    def __init__(self, transport: BoundedTransport, inner, request_id: Any):
        self.transport, self.inner, self.request_id = transport, inner, request_id

    async def __aiter__(self):
        async for event in events_bounded(self.inner, self.transport.limit):
            yield self._error_event(event) if isinstance(event, Oversized) else event

    def _error_event(self, oversized: Oversized) -> bytes:
        return (
            b"event: message\r\ndata: "
            + self.transport.tokens.replacement(self.request_id, oversized)
            + b"\r\n\r\n"
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
