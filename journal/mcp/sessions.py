"""Agent sessions on the initialize handshake, served by any Recorder process.

The SDK keeps a session (its negotiated version, what the agent declared) in the memory of the process that
answered `initialize`; behind a load balancer the next request goes elsewhere and gets "Session not found".
Here a session is also written to the database as its `initialize` is answered (`SessionStore.opened`, before
the answer leaves), and a process that gets a request of a session it does not hold adopts it: it builds the
session's server side from the record, born initialized, and answers (`SharedSessions`). Every request of a
session is checked against the record, so a session is only ever used by the agent that opened it, and one
the agent ended (its DELETE, in any process) is "Session not found" everywhere within CHECK_SECONDS.

A session's GET stream, where what a server says outside any call reaches the agent, is held by whichever
process got the agent's GET: a notification heard in another process goes to it over the bus
(`relay.Relay`, `SharedSessions.to_stream`).
"""

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
from asgiref.sync import sync_to_async
from django.utils import timezone
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage
from mcp_types import ClientCapabilities, Implementation, InitializeRequestParams, JSONRPCNotification
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.routing import Route

from .. import sdk, services

logger = logging.getLogger(__name__)

CHECK_SECONDS = 1.0  # how long a process trusts what it last read of a session
TOUCH_SECONDS = 60.0  # how often a process writes down that a session is still in use


@dataclass(frozen=True)
class SessionRecord:
    agent_id: int
    protocol_version: str
    client_info: dict
    capabilities: dict


def _write(session_id: str, record: SessionRecord) -> None:
    services.save_agent_session(session_id=session_id, agent_id=record.agent_id,
                                protocol_version=record.protocol_version, client_info=record.client_info,
                                capabilities=record.capabilities)


def _read(session_id: str, idle_seconds: float | None) -> SessionRecord | None:
    """The session, unless it was unused for longer than `idle_seconds` (then it is gone)."""
    since = timezone.now() - timedelta(seconds=idle_seconds) if idle_seconds is not None else None
    row = services.agent_session(session_id=session_id, used_since=since)
    return SessionRecord(*row) if row is not None else None


def _touch(session_id: str) -> None:
    services.touch_agent_session(session_id=session_id, now=timezone.now())


class SessionStore:
    def __init__(self, idle_seconds: float | None = None):
        self.idle_seconds = idle_seconds
        self._seen: dict[str, tuple[float, SessionRecord | None]] = {}
        self._touched: dict[str, float] = {}
        self._transports: dict[str, Any] = {}

    async def opened(self, session_id: str, record: SessionRecord) -> None:
        await sync_to_async(_write)(session_id, record)
        now = time.monotonic()
        self._seen[session_id], self._touched[session_id] = (now, record), now

    async def find(self, session_id: str) -> SessionRecord | None:
        """The session a request names (and that it is in use), or None if no agent has it open."""
        now = time.monotonic()
        seen = self._seen.get(session_id)
        if seen is None or now - seen[0] >= CHECK_SECONDS:
            if len(self._seen) > 10_000:
                self._seen.clear()
                self._touched.clear()
            seen = self._seen[session_id] = (now, await sync_to_async(_read)(session_id, self.idle_seconds))
        if seen[1] is not None and now - self._touched.get(session_id, 0.0) >= TOUCH_SECONDS:
            self._touched[session_id] = now
            await sync_to_async(_touch)(session_id)
        return seen[1]

    def ended(self, session_id: str) -> None:
        self._seen[session_id] = (time.monotonic(), None)

    def serve(self, transports: dict[str, Any]) -> None:
        """The session manager's transports, by session id (`SharedSessions`, once, as it is built)."""
        self._transports = transports

    def holds_stream(self, session_id: str) -> bool:
        """Whether the agent's GET stream of this session is open in this process."""
        transport = self._transports.get(session_id)
        return transport is not None and sdk.holds_get_stream(transport)

    async def to_stream(self, session_id: str, notification: dict[str, Any]) -> bool:
        """Send a notification on the session's GET stream if this process holds it (through the transport's
        own router, as the session's server side would: its event store sees it too)."""
        transport = self._transports.get(session_id)
        writer = sdk.get_stream_writer(transport) if transport is not None else None
        if writer is None:
            return False
        try:
            message = JSONRPCNotification.model_validate({**notification, "jsonrpc": "2.0"})
        except ValidationError:
            logger.warning("dropped a malformed notification for session %s", session_id[:8])
            return False
        try:
            await writer.send(SessionMessage(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True


def record_of(agent_id: int, request: Any, answer: Any) -> SessionRecord | None:
    """The session an `initialize` request and its answer (parsed JSON-RPC messages) opened, or None."""
    if (
        not isinstance(request, dict)
        or not isinstance(answer, dict)
        or not isinstance(answer.get("result"), dict)
    ):
        return None
    params = request.get("params") if isinstance(request.get("params"), dict) else {}
    version = answer["result"].get("protocolVersion")
    if not isinstance(version, str):
        return None
    info = params.get("clientInfo") if isinstance(params.get("clientInfo"), dict) else {}
    capabilities = params.get("capabilities") if isinstance(params.get("capabilities"), dict) else {}
    return SessionRecord(agent_id, version, info, capabilities)


class SharedSessions(sdk.AdoptingSessionManager):
    """The SDK's session manager, answering for sessions any process opened (see the module)."""

    def __init__(self, *args, store: SessionStore, **kwargs):
        super().__init__(*args, **kwargs)
        self.store = store
        store.serve(self.transports)  # the sessions this process serves, whose GET streams it may hold
        self._adopting = anyio.Lock()  # two requests of one session arriving at once adopt it once

    async def before_request(self, scope, receive, send) -> bool:
        """Refuse a session no agent has open (or another agent's), and adopt one another process opened."""
        session_id = dict(scope.get("headers") or []).get(MCP_SESSION_ID_HEADER.encode())
        if session_id is None:
            return False
        session_id = session_id.decode("latin-1")
        agent = (scope.get("state") or {}).get("agent")
        record = await self.store.find(session_id)
        if record is None or agent is None or record.agent_id != agent.pk:
            local = self.transports.get(session_id)
            if local is not None and record is None:  # ended by the agent, in another process
                await self.discard(session_id, local)
            await sdk.error_response("Session not found", 404)(scope, receive, send)
            return True
        if session_id not in self.transports:
            async with self._adopting:
                if session_id not in self.transports:
                    await self._adopt(session_id, record)
        return False

    async def _adopt(self, session_id: str, record: SessionRecord) -> None:
        """Serve a session another process opened, as if this one had answered its `initialize`."""
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        try:
            client_params = InitializeRequestParams(
                protocol_version=record.protocol_version, capabilities=ClientCapabilities.model_validate(
                    record.capabilities), client_info=Implementation.model_validate(record.client_info))
        except ValidationError:
            client_params = None

        async def run_server(*, task_status=anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                dispatcher = JSONRPCDispatcher(
                    read_stream, write_stream, inline_methods=frozenset({"initialize"})
                )
                connection = Connection(
                    dispatcher,
                    protocol_version=record.protocol_version,
                    session_id=session_id,
                    client_params=client_params,
                )
                connection.client_capabilities = client_params.capabilities if client_params else None
                connection.initialized.set()
                idle_scope = transport.idle_scope or anyio.CancelScope()
                try:
                    with idle_scope:
                        await serve_connection(self.app, dispatcher, connection=connection,
                                               lifespan_state=self.lifespan_state)
                except Exception:
                    logger.exception("adopted session %s crashed", session_id[:8])
                finally:
                    await self.discard(session_id, transport)

        await self.start_task(run_server)
        self.transports[session_id] = transport  # only once it can take requests
        logger.info("serving session %s, opened by another process", session_id[:8])


def streamable_app(
    server, *, path: str, security, store: SessionStore, idle_seconds: float | None, around=None
):
    """The SDK server's streamable HTTP app (as `Server.streamable_http_app` builds it, without the auth it
    does not use here) on `SharedSessions`. `around`, an async context manager, is entered before the
    session manager starts and left after it stops."""
    manager = SharedSessions(app=server, json_response=False, security_settings=security, store=store,
                             session_idle_timeout=idle_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with around if around is not None else contextlib.nullcontext(), manager.run():
            yield

    return Starlette(routes=[Route(path, endpoint=StreamableHTTPASGIApp(manager))], lifespan=lifespan)
