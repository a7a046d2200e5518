"""The one door to tool servers.

Every MCP exchange the project makes with a tool server goes through `Upstreams`: long-lived sessions, one
per server and agent session (reused across calls, reconnected when they break, closed when idle), a
timeout on every call, raw JSON in and out (the SDK's models drop fields such as `annotations.recovery`),
and one error type for every failure (`journal.mcp.failures.ToolServerError`).
"""

import contextlib
import hashlib
import itertools
import json
import logging
import shlex
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp  # the direct tools/call path: a fraction of httpx's cost per request under concurrency
import anyio
import httpx2 as httpx  # the HTTP library the mcp SDK itself uses
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import encode_header_value
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from .bounded import CHUNK, BoundedTransport, Oversized, read_bounded
from .declaring import DeclaringClient
from .failures import ToolServerError, first_leaf, http_status_class, too_large, translate

__all__ = ["CLIENT_INFO", "Endpoint", "ToolServerError", "Upstreams", "endpoint_of"]

logger = logging.getLogger(__name__)

_RAW = TypeAdapter(dict[str, Any])
CLIENT_INFO = types.Implementation(name="agent-undo-recorder", version="0.1.0")
_MAX_PAGES = 50
DEFAULT_MAX_ANSWER_BYTES = 32 * 1024 * 1024


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


def _reply(raw: bytes, content_type: str, request_id: int) -> Any:
    """The JSON-RPC message answering `request_id`, from a JSON body or an SSE stream; None if neither."""
    try:
        if content_type.startswith("text/event-stream"):
            for event in raw.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n"):
                data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
                if data:
                    message = json.loads(data)
                    if isinstance(message, dict) and message.get("id") == request_id:
                        return message
            return None
        return json.loads(raw)
    except ValueError:
        return None


class _Connection:
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
                    target: Any = StdioServerParameters(command=argv[0], args=argv[1:])
                else:
                    self.bounded = BoundedTransport(httpx.AsyncHTTPTransport(), self.max_answer_bytes)
                    self.http = await stack.enter_async_context(httpx.AsyncClient(
                        timeout=httpx.Timeout(self.timeout), event_hooks={"response": [self._saw]},
                        transport=self.bounded))
                    # Plan checks send dozens of calls at once to one server; its per-request cost stays flat
                    # with the number of open connections (httpx's pool scans them all on every request).
                    self.fast = await stack.enter_async_context(aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=256), timeout=aiohttp.ClientTimeout(total=None)))
                    # Answers are bounded by `bounded`; the SDK's own cap (1 MiB an event) would fail them sooner.
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

    async def call_tool_directly(self, name: str, arguments: dict[str, Any], meta: Mapping[str, Any] | None,
                                 timeout: float, retry: Mapping[str, Any] | None = None,
                                 capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One tools/call as the SDK would send it on a 2026-07-28 connection (the per-request `_meta`
        envelope and the Mcp-* headers), without its per-call machinery: this is the Recorder's hot path.

        The answer is validated against the protocol's tools/call result, exactly as the SDK would, so a
        server that lies still gets the same error."""
        version = self.client.protocol_version
        envelope = {
            PROTOCOL_VERSION_META_KEY: version,
            CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(mode="json", exclude_none=True),
            CLIENT_CAPABILITIES_META_KEY: dict(capabilities or {}),  # the agent's: declared per request
        }
        request_id = next(self.request_ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": name, "arguments": arguments, "_meta": {**(meta or {}), **envelope},
                           **(retry or {})}}
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                   "mcp-protocol-version": version, "mcp-method": "tools/call", "mcp-name": encode_header_value(name)}
        server = self.endpoint.name
        try:
            with anyio.fail_after(timeout):
                async with self.fast.post(self.endpoint.url, data=json.dumps(body), headers=headers,
                                          allow_redirects=False) as response:
                    raw = await read_bounded(response.content.iter_chunked(CHUNK), self.max_answer_bytes)
                    status, content_type = response.status, response.headers.get("content-type", "")
        except aiohttp.ClientConnectorError:
            raise ToolServerError(f"{server} refused the connection", failure_class="transient", transient=True) from None
        except TimeoutError:
            raise ToolServerError(f"{server} did not answer in time", failure_class="transient", transient=True,
                                  may_have_acted=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ToolServerError(f"{server} connection failed: {type(exc).__name__}", failure_class="transient",
                                  transient=True, may_have_acted=True) from None
        if isinstance(raw, Oversized):
            raise too_large(server, raw)
        message = _reply(raw, content_type, request_id)
        if isinstance(message, dict) and isinstance(message.get("error"), dict):
            error = message["error"]
            code = error.get("code") if isinstance(error.get("code"), int) else -32603
            raise translate(MCPError(code=code, message=str(error.get("message", "")), data=error.get("data")),
                            server=server, sent=True)
        if status >= 400:
            failure_class, transient = http_status_class(status)
            raise ToolServerError(f"{server} answered HTTP {status}", failure_class=failure_class,
                                  transient=transient, may_have_acted=status >= 500)
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict):
            raise ToolServerError(f"{server} answered with something that is not valid MCP", failure_class="unknown",
                                  may_have_acted=True)
        try:
            _methods.validate_server_result("tools/call", version, result)
        except (ValidationError, ValueError, KeyError):
            raise ToolServerError(f"{server} answered with something that is not a valid MCP result",
                                  failure_class="unknown", may_have_acted=True) from None
        return result

    def translate(self, exc: BaseException, *, sent: bool) -> "ToolServerError":
        oversized = self.bounded.taken_from(exc) if self.bounded is not None and isinstance(exc, MCPError) else None
        if oversized is not None:
            return too_large(self.endpoint.name, oversized)
        status, self.last_http_error = self.last_http_error, None
        if status is not None and isinstance(exc, MCPError) and exc.error.code in (-32603, -32600, -32601):
            failure_class, transient = http_status_class(status)
            return ToolServerError(f"{self.endpoint.name} answered HTTP {status}", failure_class=failure_class,
                                   transient=transient, may_have_acted=sent and status >= 500)
        return translate(exc, server=self.endpoint.name, sent=sent)


# Whose upstream session a call uses: an agent's session, as `(agent id, its MCP session id or "")`, or None
# for the service's own (catalogue reads, plan checks, compensations).
Owner = Hashable | None


class Upstreams:
    """Open sessions to tool servers, for the life of an `async with` block: one per server and owner.

    Nothing a tool server keeps per session is shared between owners: each agent session gets its own
    upstream session (a stdio server, its own process), opened on first use. A streamable HTTP server on
    the stateless 2026-07-28 protocol keeps nothing per session, so its one connection serves every owner.
    With `idle_seconds`, a session nobody has used for that long is closed (a stdio server's process
    stopped); with `max_sessions`, opening one more first closes the least recently used idle one.
    """

    def __init__(self, *, timeout: float = 30.0, direct: bool = True, idle_seconds: float | None = None,
                 max_sessions: int | None = None, max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
                 client_options=None):
        self.timeout = timeout
        # (owner, server name) -> the SDK client's callbacks for that session (`relay.Relay.client_options`)
        self.client_options = client_options
        self.max_answer_bytes = max_answer_bytes
        self.direct = direct  # False forces every call through the SDK (tests compare the two paths)
        self.idle_seconds = idle_seconds
        self.max_sessions = max_sessions
        self._connections: dict[tuple[Endpoint, Owner], _Connection] = {}
        self._lock = anyio.Lock()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._reaper: anyio.CancelScope | None = None

    async def __aenter__(self) -> "Upstreams":
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        if self.idle_seconds:
            self._task_group.start_soon(self._close_idle_ones)
        return self

    async def __aexit__(self, *exc_info) -> None:
        for connection in self._connections.values():
            connection.closing.set()
        self._connections.clear()
        assert self._task_group is not None
        if self._reaper is not None:
            self._reaper.cancel()
        with contextlib.suppress(Exception):
            await self._task_group.__aexit__(None, None, None)

    def open_sessions(self, owner: Owner = None) -> list[str]:
        """The names of the servers `owner` has a session of its own with (tests and the admin read it)."""
        return sorted(endpoint.name for (endpoint, whose), connection in self._connections.items()
                      if whose == owner and not connection.closing.is_set())

    def close_owner(self, owner: Owner) -> None:
        """Close every upstream session of `owner` (an agent's session ended)."""
        for key, connection in list(self._connections.items()):
            if key[1] == owner:
                self._discard(key, connection)

    async def _close_idle_ones(self) -> None:
        assert self.idle_seconds
        with anyio.CancelScope() as self._reaper:
            while True:
                await anyio.sleep(min(self.idle_seconds / 4, 15.0))
                cutoff = time.monotonic() - self.idle_seconds
                for key, connection in list(self._connections.items()):
                    if connection.ready.is_set() and connection.busy == 0 and connection.last_used < cutoff:
                        logger.info("closing the idle upstream session to %s", key[0].name)
                        self._discard(key, connection)

    async def _session(self, endpoint: Endpoint, owner: Owner):
        if owner is not None and endpoint.transport == "http":
            shared = await self._session(endpoint, None)  # says which protocol the server speaks
            if shared.stateless:
                return shared
        key = (endpoint, owner)
        connection = self._connections.get(key)
        if connection is not None and connection.ready.is_set() and connection.error is None \
                and not connection.closing.is_set():
            return connection  # the common case, on every call: no lock, no timer
        async with self._lock:
            for other, open_one in list(self._connections.items()):
                if other[0].name == endpoint.name and other[0] != endpoint:
                    # The server was moved or its command replaced: the old sessions (and a stdio server's
                    # old processes) are closed, never left running beside the new ones.
                    self._discard(other, open_one)
            connection = self._connections.get(key)
            if connection is None or connection.error is not None or connection.closing.is_set():
                self._make_room(endpoint)
                options = self.client_options(owner, endpoint.name) if self.client_options and owner else None
                connection = _Connection(endpoint, self.timeout, self.max_answer_bytes, options)
                self._connections[key] = connection
                assert self._task_group is not None
                self._task_group.start_soon(connection.keep)
        with anyio.fail_after(self.timeout):
            await connection.ready.wait()
        if connection.error is not None:
            raise connection.translate(first_leaf(connection.error), sent=False)
        return connection

    def _make_room(self, endpoint: Endpoint) -> None:
        """Below `max_sessions`, by closing the least recently used idle session; if every one is busy, the
        call is refused (nothing was sent) rather than opening sessions without bound."""
        live = {key: c for key, c in self._connections.items() if not c.closing.is_set()}
        if self.max_sessions is None or len(live) < self.max_sessions:
            return
        idle = [(c.last_used, key) for key, c in live.items() if c.busy == 0 and c.ready.is_set()]
        if not idle:
            raise ToolServerError(
                f"{endpoint.name} was not called: the Recorder already has {len(live)} upstream sessions in use, "
                "its limit (RECORDER_MAX_UPSTREAM_SESSIONS)", failure_class="transient", transient=True)
        _, oldest = min(idle, key=lambda pair: pair[0])
        self._discard(oldest, self._connections[oldest])

    def _discard(self, key: tuple[Endpoint, Owner], connection: _Connection) -> None:
        connection.closing.set()
        if self._connections.get(key) is connection:
            del self._connections[key]

    def _forget(self, connection: _Connection) -> None:
        """Close `connection` after a failure that may have broken it; the next call opens a fresh one."""
        for key, open_one in list(self._connections.items()):
            if open_one is connection:
                self._discard(key, open_one)

    async def _opened(self, endpoint: Endpoint, owner: Owner) -> "_Connection":
        """The open session to `endpoint` for `owner`, or a ToolServerError saying why there is none
        (nothing was sent)."""
        try:
            return await self._session(endpoint, owner)
        except TimeoutError:
            raise ToolServerError(f"{endpoint.name} did not accept a connection in time", failure_class="transient",
                                  transient=True) from None
        except ToolServerError:
            raise
        except Exception as exc:
            raise translate(exc, server=endpoint.name, sent=False) from exc

    @contextlib.asynccontextmanager
    async def _using(self, endpoint: Endpoint, owner: Owner):
        """The open session to `endpoint` for `owner`, counted as in use meanwhile."""
        connection = await self._opened(endpoint, owner)
        connection.busy += 1
        try:
            yield connection
        finally:
            connection.busy -= 1
            connection.last_used = time.monotonic()

    async def request(self, endpoint: Endpoint, request: Any, *, timeout: float | None = None,
                      progress=None, owner: Owner = None, sending=None) -> dict[str, Any]:
        """Send one request on `owner`'s session and return the raw result dict, or raise ToolServerError.
        With `progress`, the request carries a progress token of its own and `progress(done, total, message)`
        is awaited for each progress notification the server sends about it. `sending()`, if given, is
        called as the request is about to leave (before that, the server cannot have had it)."""
        timeout = timeout or self.timeout
        async with self._using(endpoint, owner) as connection:
            if sending is not None:
                sending()
            try:
                with anyio.fail_after(timeout):
                    result = await connection.client.session.send_request(
                        request, _RAW, request_read_timeout_seconds=timeout, progress_callback=progress)
            except MCPError as exc:
                # An error answer leaves the session healthy; a transport failure does not.
                if exc.error.code == -32001:
                    self._forget(connection)
                raise connection.translate(exc, sent=True) from exc
            except Exception as exc:
                self._forget(connection)
                raise connection.translate(exc, sent=True) from exc
        if connection.bounded is None:  # stdio: the answer was read whole, but is still never relayed
            body = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
            if len(body) > self.max_answer_bytes:
                raise too_large(endpoint.name, Oversized(len(body), hashlib.sha256(body).hexdigest(),
                                                         self.max_answer_bytes))
        return result

    async def list_tools(self, endpoint: Endpoint, *, timeout: float | None = None,
                         owner: Owner = None) -> list[dict[str, Any]]:
        """Every page of the server's raw `tools/list`."""
        return await self.list_all(endpoint, types.ListToolsRequest, "tools", timeout=timeout, owner=owner)

    async def list_all(self, endpoint: Endpoint, request_type, key: str, *, timeout: float | None = None,
                       owner: Owner = None, meta: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every page of a raw list (`tools/list`, `resources/list`, ...): the items under `key`."""
        items: list[dict[str, Any]] = []
        cursor = None
        for _ in range(_MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor, _meta=dict(meta) if meta else None) \
                if cursor or meta else None
            page = await self.request(endpoint, request_type(params=params), timeout=timeout, owner=owner)
            listed = page.get(key)
            if not isinstance(listed, list):
                raise ToolServerError(f"{endpoint.name} sent a list without a {key} array", failure_class="unknown")
            items.extend(item for item in listed if isinstance(item, dict))
            cursor = page.get("nextCursor")
            if not cursor:
                return items
        raise ToolServerError(f"{endpoint.name} sent more than {_MAX_PAGES} pages of {key}", failure_class="unknown")

    async def call_tool(
        self, endpoint: Endpoint, name: str, arguments: Mapping[str, Any] | None,
        *, meta: Mapping[str, Any] | None = None, timeout: float | None = None, progress=None, owner: Owner = None,
        sending=None, retry: Mapping[str, Any] | None = None, capabilities: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The raw `tools/call` result, `isError` results included (they are answers, not failures). `retry`
        carries a 2026-07-28 retry's `inputResponses` and `requestState`, as the wire names them, and
        `capabilities` the client capabilities a call on a stateless connection declares (the agent's). With
        `progress`, the server's progress notifications about the call are relayed to it (see `request`);
        the direct path, which reads one answer and nothing else, is then not taken."""
        if endpoint.transport == "http" and self.direct and progress is None:
            connection = await self._opened(endpoint, owner)
            if connection.direct_calls:  # the hot path: counted in use by hand (no context manager per call)
                if sending is not None:
                    sending()
                connection.busy += 1
                try:
                    return await connection.call_tool_directly(name, dict(arguments or {}), meta,
                                                               timeout or self.timeout, retry, capabilities)
                except ToolServerError as exc:
                    if exc.transient:  # the connection may be what broke; open a fresh one next time
                        self._forget(connection)
                    raise
                finally:
                    connection.busy -= 1
                    connection.last_used = time.monotonic()
        params = types.CallToolRequestParams.model_validate({
            "name": name, "arguments": dict(arguments or {}), **({"_meta": dict(meta)} if meta else {}), **(retry or {})})
        return await self.request(endpoint, types.CallToolRequest(params=params), timeout=timeout, progress=progress,
                                  owner=owner, sending=sending)
