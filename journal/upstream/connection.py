"""One open session to one tool server (`Connection`), and the direct tools/call path on it.

`client.Upstreams` decides which connection serves which call; a connection holds the SDK's client (a
stdio process, or a streamable HTTP session), entered and left by a keeper task of its own, and for a
server on the stateless 2026-07-28 protocol a plain HTTP session for the Recorder's hot path.
"""

import contextlib
import itertools
import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp  # the direct tools/call path: a fraction of httpx's cost per request under concurrency
import anyio
import httpx2 as httpx  # the HTTP library the mcp SDK itself uses
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import encode_header_value
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    LOG_LEVEL_META_KEY,
    PROTOCOL_VERSION_META_KEY,
)
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from ..telemetry import tracing
from .bounded import CHUNK, BoundedTransport, Oversized, Redirected, Tokens, events_bounded, read_bounded
from .declaring import DeclaringClient
from .failures import ToolServerError, http_status_class, too_large, translate
from .stdio import bounded_stdio_client

CLIENT_INFO = types.Implementation(name="agent-undo-recorder", version="0.1.0")
# The MCP tasks extension (SEP-2663): a server may answer a tools/call with a task handle of this result type.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_RESULT = "task"


@dataclass(frozen=True)
class Endpoint:
    """How to reach one tool server; plain data so tasks and the gateway can share it without the ORM."""

    name: str
    transport: str  # "http" or "stdio"
    url: str = ""
    command: str = ""


def endpoint_of(server) -> Endpoint:
    """The Endpoint of a `journal.models.ToolServer` row."""
    return Endpoint(name=server.name, transport=server.transport, url=server.url, command=server.command)


def _event_message(event: bytes) -> Any:
    """The JSON-RPC message one server-sent event carries, or None."""
    lines = event.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    data = "\n".join(line[5:].removeprefix(" ") for line in lines if line.startswith("data:"))
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def _answer_in(events, request_id: int, token: int, progress, logged=None) -> Any:
    """The JSON-RPC message answering `request_id` in an event stream (None if it has none, an `Oversized`
    if an event over the limit came instead), awaiting `progress(done, total, message)` for each progress
    notification on `token` before it, and `logged(params)` for each log message of the call's."""
    oversized = None
    async for event in events:
        if isinstance(event, Oversized):
            oversized = event  # the answer, unless one within the limit still comes
            continue
        message = _event_message(event)
        if not isinstance(message, dict):
            continue
        if message.get("id") == request_id and "method" not in message:
            return message
        params = message.get("params")
        if logged is not None and message.get("method") == "notifications/message" \
                and isinstance(params, dict):
            await logged(params)
            continue
        if (
            progress is not None
            and message.get("method") == "notifications/progress"
            and isinstance(params, dict)
            and params.get("progressToken") == token
            and isinstance(params.get("progress"), int | float)
        ):
            total, said = params.get("total"), params.get("message")
            await progress(params["progress"], total if isinstance(total, int | float) else None,
                           said if isinstance(said, str) else None)
    return oversized


def _envelope(version: str, capabilities: Mapping[str, Any] | None, log_level: str | None = None) -> dict:
    """The per-request `_meta` envelope of a 2026-07-28 request, as the SDK writes it."""
    return {
        PROTOCOL_VERSION_META_KEY: version,
        CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(mode="json", exclude_none=True),
        CLIENT_CAPABILITIES_META_KEY: dict(capabilities or {}),
        **({LOG_LEVEL_META_KEY: log_level} if log_level else {}),
    }


def _call_body(request_id: int, version: str, name: str, arguments: dict[str, Any],
               meta: Mapping[str, Any] | None, *, retry: Mapping[str, Any] | None,
               capabilities: Mapping[str, Any] | None, progress: bool, log_level: str | None) -> dict:
    """A 2026-07-28 tools/call request as the SDK sends it: the per-request `_meta` envelope (the agent's
    capabilities, declared per request, and its log level when it asked for the call's logs), and a progress
    token of the Recorder's own when progress is relayed."""
    envelope = _envelope(version, capabilities, log_level)
    asked = {"progressToken": request_id} if progress else {}
    params = {"name": name, "arguments": arguments, "_meta": {**(meta or {}), **asked, **envelope}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {**params, **(retry or {})}}


class Connection:
    """One open session, owned by a keeper task so that it is entered and left in the same task.

    The SDK turns an HTTP error status into a generic JSON-RPC internal error; the response hook keeps the
    status so the failure can still be classified (a 502 is transient, a 403 is not).
    """

    def __init__(self, endpoint: Endpoint, timeout: float, max_answer_bytes: int,
                 options: dict[str, Any] | None = None):
        self.endpoint = endpoint
        self.options = options or {}  # the SDK client's callbacks: what the server may send or ask the agent
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self.bounded: BoundedTransport | None = None
        self.tokens = Tokens(max_answer_bytes)  # answers over the limit, replaced on either transport
        self.client: Client | None = None
        self.ready = anyio.Event()
        self.closing = anyio.Event()
        self.error: BaseException | None = None
        self.last_http_error: int | None = None
        self.http: Any = None  # the SDK's HTTP client for this server
        self.fast: aiohttp.ClientSession | None = None  # our own, for the direct tools/call path
        self.request_ids = itertools.count(1)
        self.busy = 0  # calls in flight on it
        self.last_used = time.monotonic()

    async def _saw(self, response) -> None:
        if response.status_code >= 400:
            self.last_http_error = response.status_code

    async def keep(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.endpoint.transport == "stdio":
                    argv = shlex.split(self.endpoint.command)
                    target: Any = bounded_stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]),
                                                       self.max_answer_bytes, self.tokens)
                else:
                    self.bounded = BoundedTransport(
                        httpx.AsyncHTTPTransport(), self.max_answer_bytes, self.tokens
                    )
                    self.http = await stack.enter_async_context(httpx.AsyncClient(
                        timeout=httpx.Timeout(self.timeout), event_hooks={"response": [self._saw]},
                        transport=self.bounded))
                    # Plan checks send dozens of calls at once to one server; its per-request cost stays flat
                    # with the number of open connections (httpx's pool scans them all on every request).
                    self.fast = await stack.enter_async_context(aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=256), timeout=aiohttp.ClientTimeout(total=None)))
                    # Answers are bounded by `bounded`; the SDK's own cap (1 MiB an event) would fail them
                    # sooner.
                    target = streamable_http_client(self.endpoint.url, http_client=self.http,
                                                    max_sse_event_size=self.max_answer_bytes + CHUNK)
                self.client = DeclaringClient(target, read_timeout_seconds=self.timeout, cache=None,
                                              client_info=CLIENT_INFO, **self.options)
                await stack.enter_async_context(self.client)
                self.last_used = time.monotonic()
                self.ready.set()
                await self.closing.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits on `ready`
            self.error = exc
            self.ready.set()
            if not isinstance(exc, Exception):
                raise

    @property
    def stateless(self) -> bool:
        """A streamable HTTP server on the stateless 2026-07-28 protocol: it keeps nothing per session."""
        return self.http is not None and self.client is not None \
            and self.client.protocol_version in MODERN_PROTOCOL_VERSIONS

    @property
    def direct_calls(self) -> bool:
        """Whether tools/call can skip the SDK: a streamable HTTP server that negotiated the stateless
        2026-07-28 protocol, where each call is one self-contained POST."""
        return (
            self.fast is not None and self.client is not None
            and self.client.protocol_version in MODERN_PROTOCOL_VERSIONS
        )

    async def call_tool_directly(
        self,
        name: str,
        arguments: dict[str, Any],
        meta: Mapping[str, Any] | None,
        timeout: float,
        retry: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        progress=None,
        logged=None,
    ) -> dict[str, Any]:
        """One tools/call as the SDK would send it on a 2026-07-28 connection (the per-request `_meta`
        envelope and the Mcp-* headers), without its per-call machinery: this is the Recorder's hot path.

        The answer is validated against the protocol's tools/call result, exactly as the SDK would, so a
        server that lies still gets the same error. A task handle (`resultType: "task"`, the tasks extension)
        is the extension's own shape, which the protocol's schema does not describe: it is checked by
        `journal.mcp.task_calls`."""
        request_id = next(self.request_ids)
        body = _call_body(request_id, self.client.protocol_version, name, arguments, meta, retry=retry,
                          capabilities=capabilities, progress=progress is not None,
                          log_level=logged[0] if logged else None)
        result = await self._exchange(body, name, timeout, progress, logged[1] if logged else None)
        if result.get("resultType") == TASK_RESULT:
            return result
        try:
            _methods.validate_server_result("tools/call", self.client.protocol_version, result)
        except (ValidationError, ValueError, KeyError):
            raise ToolServerError(f"{self.endpoint.name} answered with something that is not a valid MCP "
                                  "result", failure_class="unknown", may_have_acted=True) from None
        return result

    async def task_request(self, method: str, params: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """One request of the tasks extension (`tasks/get`, `tasks/update`, `tasks/cancel`) about the task
        `params["taskId"]`, declaring the extension as the extension requires; the raw result."""
        version = self.client.protocol_version
        envelope = _envelope(version, {"extensions": {TASKS_EXTENSION: {}}})
        body = {"jsonrpc": "2.0", "id": next(self.request_ids), "method": method,
                "params": {**params, "_meta": envelope}}
        return await self._exchange(body, str(params.get("taskId", "")), timeout)

    async def _exchange(self, body: dict, name: str, timeout: float, progress=None, logged=None) -> dict:
        """POST one request (`body`) and return its result, or raise ToolServerError: a JSON-RPC error as
        the server sent it, anything else classified (refused, timed out, over the limit, not MCP)."""
        version, request_id = self.client.protocol_version, body["id"]
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": version,
            "mcp-method": body["method"],
            "mcp-name": encode_header_value(name),
        }
        tracing.headers_with_trace(headers)  # the server's spans are children of the Recorder's call
        server = self.endpoint.name
        try:
            with anyio.fail_after(timeout):
                async with self.fast.post(self.endpoint.url, data=json.dumps(body), headers=headers,
                                          allow_redirects=False) as response:
                    status, content_type = response.status, response.headers.get("content-type", "")
                    if 300 <= status < 400:
                        raise ToolServerError(
                            Redirected(status, response.headers.get("location", "")).message(server),
                            failure_class="unknown",
                        )
                    chunks = response.content.iter_chunked(CHUNK)
                    if content_type.startswith(
                        "text/event-stream"
                    ):  # progress, then the answer, as they come
                        message = await _answer_in(events_bounded(chunks, self.max_answer_bytes), request_id,
                                                   request_id, progress, logged)
                    else:
                        message = await read_bounded(chunks, self.max_answer_bytes)
                        if not isinstance(message, Oversized):
                            message = _json(message)
        except aiohttp.ClientConnectorError:
            raise ToolServerError(
                f"{server} refused the connection", failure_class="transient", transient=True
            ) from None
        except TimeoutError:
            raise ToolServerError(
                f"{server} did not answer in time",
                failure_class="transient",
                transient=True,
                may_have_acted=True,
                timed_out=True,
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ToolServerError(
                f"{server} connection failed: {type(exc).__name__}",
                failure_class="transient",
                transient=True,
                may_have_acted=True,
            ) from None
        if isinstance(message, Oversized):
            raise too_large(server, message)
        if isinstance(message, dict) and isinstance(message.get("error"), dict):
            error = message["error"]
            code = error.get("code") if isinstance(error.get("code"), int) else -32603
            raise translate(
                MCPError(code=code, message=str(error.get("message", "")), data=error.get("data")),
                server=server,
                sent=True,
            )
        if status >= 400:
            failure_class, transient = http_status_class(status)
            raise ToolServerError(f"{server} answered HTTP {status}", failure_class=failure_class,
                                  transient=transient, may_have_acted=status >= 500)
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict):
            raise ToolServerError(
                f"{server} answered with something that is not valid MCP",
                failure_class="unknown",
                may_have_acted=True,
            )
        return result

    def translate(self, exc: BaseException, *, sent: bool) -> "ToolServerError":
        replaced = self.tokens.taken_from(exc) if isinstance(exc, MCPError) else None
        if isinstance(replaced, Redirected):
            return ToolServerError(replaced.message(self.endpoint.name), failure_class="unknown")
        if replaced is not None:
            return too_large(self.endpoint.name, replaced)
        status, self.last_http_error = self.last_http_error, None
        if status is not None and isinstance(exc, MCPError) and exc.error.code in (-32603, -32600, -32601):
            failure_class, transient = http_status_class(status)
            return ToolServerError(
                f"{self.endpoint.name} answered HTTP {status}",
                failure_class=failure_class,
                transient=transient,
                may_have_acted=sent and status >= 500,
            )
        return translate(exc, server=self.endpoint.name, sent=sent)
