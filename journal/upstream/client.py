"""The one door to tool servers.

Every MCP exchange the project makes with a tool server goes through `Upstreams`: long-lived sessions, one
per server and agent session (reused across calls, reconnected when they break, closed when idle), a
timeout on every call, raw JSON in and out (the SDK's models drop fields such as `annotations.recovery`),
and one error type for every failure (`journal.upstream.failures.ToolServerError`).
"""

import contextlib
import logging
import time
from collections.abc import Hashable, Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from pydantic import TypeAdapter

from .connection import CLIENT_INFO, Connection, Endpoint, endpoint_of
from .failures import ToolServerError, first_leaf, translate

__all__ = ["CLIENT_INFO", "Endpoint", "ToolServerError", "Upstreams", "endpoint_of"]

logger = logging.getLogger(__name__)

_RAW = TypeAdapter(dict[str, Any])
_MAX_PAGES = 50
DEFAULT_MAX_ANSWER_BYTES = 32 * 1024 * 1024


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
                 client_options=None, on_handshake=None):
        self.timeout = timeout
        # (owner, server name) -> the SDK client's callbacks for that session (`relay.Relay.client_options`)
        self.client_options = client_options
        # owner -> whether its agent is on the initialize handshake: its sessions are then of its own, on the
        # handshake, even with a server that speaks the stateless protocol (`relay.Relay.on_handshake`)
        self.on_handshake = on_handshake
        self._stateless_only: set[Endpoint] = set()  # servers that refused a handshake agent's session
        self.max_answer_bytes = max_answer_bytes
        self.direct = direct  # False forces every call through the SDK (tests compare the two paths)
        self.idle_seconds = idle_seconds
        self.max_sessions = max_sessions
        self._connections: dict[tuple[Endpoint, Owner], Connection] = {}
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
        on_handshake = owner is not None and self.on_handshake is not None and self.on_handshake(owner) \
            and endpoint not in self._stateless_only
        if owner is not None and endpoint.transport == "http" and not on_handshake:
            shared = await self._session(endpoint, None)  # says which protocol the server speaks
            if shared.stateless:
                return shared
        try:
            return await self._own_session(endpoint, owner)
        except ToolServerError:
            if not on_handshake or endpoint.transport != "http":
                raise
            # A server that does not speak the handshake: the agent gets the stateless protocol's session.
            shared = await self._session(endpoint, None)
            if not shared.stateless:
                raise
            self._stateless_only.add(endpoint)
            return shared

    async def _own_session(self, endpoint: Endpoint, owner: Owner):
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
                connection = Connection(endpoint, self.timeout, self.max_answer_bytes, options)
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
                f"{endpoint.name} was not called: the Recorder already has {len(live)} upstream sessions in "
                f"use, "
                "its limit (RECORDER_MAX_UPSTREAM_SESSIONS)",
                failure_class="transient",
                transient=True,
            )
        _, oldest = min(idle, key=lambda pair: pair[0])
        self._discard(oldest, self._connections[oldest])

    def _discard(self, key: tuple[Endpoint, Owner], connection: Connection) -> None:
        connection.closing.set()
        if self._connections.get(key) is connection:
            del self._connections[key]

    def _forget(self, connection: Connection) -> None:
        """Close `connection` after a failure that may have broken it; the next call opens a fresh one."""
        for key, open_one in list(self._connections.items()):
            if open_one is connection:
                self._discard(key, open_one)

    async def _opened(self, endpoint: Endpoint, owner: Owner) -> "Connection":
        """The open session to `endpoint` for `owner`, or a ToolServerError saying why there is none
        (nothing was sent)."""
        try:
            return await self._session(endpoint, owner)
        except TimeoutError:
            raise ToolServerError(
                f"{endpoint.name} did not accept a connection in time",
                failure_class="transient",
                transient=True,
                timed_out=True,
            ) from None
        except ToolServerError:
            raise
        except Exception as exc:
            raise translate(exc, server=endpoint.name, sent=False) from exc

    async def stateless_client(self, endpoint: Endpoint):
        """The SDK client of the one connection to `endpoint` if it is a streamable HTTP server on the
        stateless protocol (serving every owner), else None."""
        shared = await self._opened(endpoint, None)
        return shared.client if shared.stateless else None

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
        return result

    async def task_request(self, endpoint: Endpoint, method: str, params: Mapping[str, Any], *,
                           owner: Owner = None) -> dict[str, Any]:
        """A request of the tasks extension (`tasks/get`, `tasks/update`, `tasks/cancel`) to `endpoint`, on
        `owner`'s session; the raw result, or a ToolServerError. Tasks live on the stateless 2026-07-28
        protocol, so a server on any other is told nothing (the error says why)."""
        async with self._using(endpoint, owner) as connection:
            if not connection.direct_calls:
                raise ToolServerError(f"{endpoint.name} does not speak the 2026-07-28 protocol, where tasks "
                                      "live", failure_class="not_found")
            try:
                return await connection.task_request(method, params, self.timeout)
            except ToolServerError as exc:
                if exc.transient:
                    self._forget(connection)
                raise

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
                raise ToolServerError(
                    f"{endpoint.name} sent a list without a {key} array", failure_class="unknown"
                )
            items.extend(item for item in listed if isinstance(item, dict))
            cursor = page.get("nextCursor")
            if not cursor:
                return items
        raise ToolServerError(
            f"{endpoint.name} sent more than {_MAX_PAGES} pages of {key}", failure_class="unknown"
        )

    async def call_tool(
        self,
        endpoint: Endpoint,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        meta: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        progress=None,
        owner: Owner = None,
        sending=None,
        retry: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        logged=None,
    ) -> dict[str, Any]:
        """The raw `tools/call` result, `isError` results included (they are answers, not failures). `retry`
        carries a 2026-07-28 retry's `inputResponses` and `requestState`, as the wire names them, and
        `capabilities` the client capabilities a call on a stateless connection declares (the agent's). With
        `progress`, the server's progress notifications about the call are relayed to it (see `request`).
        `logged` is (level, callback) for a 2026-07-28 agent that asked for the call's log messages: the
        server is asked for them at that level and each is relayed to `callback(params)`."""
        if endpoint.transport == "http" and self.direct:
            connection = await self._opened(endpoint, owner)
            if connection.direct_calls:  # the hot path: counted in use by hand (no context manager per call)
                if sending is not None:
                    sending()
                connection.busy += 1
                try:
                    return await connection.call_tool_directly(name, dict(arguments or {}), meta,
                                                               timeout or self.timeout, retry, capabilities,
                                                               progress, logged)
                except ToolServerError as exc:
                    if exc.transient:  # the connection may be what broke; open a fresh one next time
                        self._forget(connection)
                    raise
                finally:
                    connection.busy -= 1
                    connection.last_used = time.monotonic()
        params = types.CallToolRequestParams.model_validate(
            {
                "name": name,
                "arguments": dict(arguments or {}),
                **({"_meta": dict(meta)} if meta else {}),
                **(retry or {}),
            }
        )
        return await self.request(
            endpoint,
            types.CallToolRequest(params=params),
            timeout=timeout,
            progress=progress,
            owner=owner,
            sending=sending,
        )
