"""Every private name of the `mcp` SDK the project relies on, in one place.

Written against mcp 2.3 (`SDK_VERSION`; `pyproject.toml` pins that minor version). The SDK offers no public
way to do these few things: read a stdio server's output in bounded chunks (`journal.upstream.stdio`),
declare exactly an agent's capabilities upstream (`journal.upstream.declaring`), and serve a handshake
session that another Recorder process opened (`journal.mcp.sessions`). Each is reached here, under a name of
ours, and nowhere else; `missing()` says which of them a newer SDK no longer has, and
`tests/journal/test_sdk.py` fails with that list before anything subtler breaks.
"""

import inspect
import re
from importlib import import_module
from typing import Any

from mcp import Client
from mcp.client import stdio as _stdio
from mcp.server import streamable_http as _streamable_http
from mcp.server import streamable_http_manager as _manager
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

SDK_VERSION = "2.3"

# (module, class or None, name): the functions, methods and attributes used below. A class's attribute is
# looked for in its source when instances set it (`self.<name> = …` or `self.<name>: … = …`), since no class
# attribute carries it.
PRIVATE_NAMES = (
    ("mcp.client.stdio", None, "_create_platform_compatible_process"),
    ("mcp.client.stdio", None, "_parse_line"),
    ("mcp.client.stdio", None, "_drain_stdout"),
    ("mcp.client.stdio", None, "_stop_server_process"),
    ("mcp.client.client", "Client", "_build_session"),
    ("mcp.client.session", "ClientSession", "_build_capabilities"),
    ("mcp.server.streamable_http_manager", None, "_error_response"),
    ("mcp.server.streamable_http_manager", "StreamableHTTPSessionManager", "_handle_stateful_request"),
    ("mcp.server.streamable_http_manager", "StreamableHTTPSessionManager", "_discard_session"),
    ("mcp.server.streamable_http_manager", "StreamableHTTPSessionManager", "_server_instances"),
    ("mcp.server.streamable_http_manager", "StreamableHTTPSessionManager", "_lifespan_state"),
    ("mcp.server.streamable_http_manager", "StreamableHTTPSessionManager", "_task_group"),
    ("mcp.server.streamable_http", "StreamableHTTPServerTransport", "_request_streams"),
    ("mcp.server.streamable_http", "StreamableHTTPServerTransport", "_write_stream"),
)


def missing() -> list[str]:
    """The private names above that the installed SDK lacks (empty when every one is there)."""
    gone = []
    for module_name, class_name, name in PRIVATE_NAMES:
        try:
            owner: Any = import_module(module_name)
            if class_name is not None:
                owner = getattr(owner, class_name)
        except (ImportError, AttributeError):
            gone.append(f"{module_name}.{class_name or name}")
            continue
        if hasattr(owner, name):
            continue
        if class_name is not None and re.search(rf"self\.{name}\s*[:=]", _source(owner)):
            continue
        gone.append(f"{module_name}.{f'{class_name}.' if class_name else ''}{name}")
    return gone


def _source(cls: type) -> str:
    try:
        return "".join(
            inspect.getsource(klass) for klass in cls.__mro__ if klass.__module__.startswith("mcp")
        )
    except (OSError, TypeError):
        return ""


# --- stdio: the SDK's process handling, around a reader of our own (`journal.upstream.stdio`) ---

create_process = _stdio._create_platform_compatible_process
parse_line = _stdio._parse_line
drain_stdout = _stdio._drain_stdout
stop_process = _stdio._stop_server_process


# --- the client: a hook once its session is built, and the capabilities that session declares ---

class HookedClient(Client):
    """The SDK's client, handing each session it builds to `session_built` (which may change it)."""

    async def _build_session(self, exit_stack):
        return self.session_built(await super()._build_session(exit_stack))

    def session_built(self, session):
        return session


def wrap_capabilities(session, wrap) -> None:
    """Make `session` declare `wrap(built)(version)`, where `built(version)` is what it would declare."""
    session._build_capabilities = wrap(session._build_capabilities)


# --- the server: sessions a process did not open itself (`journal.mcp.sessions.SharedSessions`) ---

error_response = _manager._error_response
GET_STREAM_KEY = _streamable_http.GET_STREAM_KEY


class AdoptingSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, with what serving another process's sessions needs under public names:
    `before_request` may answer a stateful request itself (returning True) before the SDK does."""

    async def _handle_stateful_request(self, scope, receive, send) -> None:
        if not await self.before_request(scope, receive, send):
            await super()._handle_stateful_request(scope, receive, send)

    async def before_request(self, scope, receive, send) -> bool:
        return False

    @property
    def transports(self) -> dict[str, Any]:
        """The transports of the sessions this process serves, by session id (the SDK's own dict)."""
        return self._server_instances

    @property
    def lifespan_state(self) -> Any:
        return self._lifespan_state

    async def discard(self, session_id: str, transport) -> None:
        await self._discard_session(session_id, transport)

    async def start_task(self, run) -> None:
        """Start `run` in the manager's task group, as the SDK starts a session it opens."""
        assert self._task_group is not None
        await self._task_group.start(run)


def holds_get_stream(transport) -> bool:
    """Whether the agent's GET stream is open on this transport."""
    return GET_STREAM_KEY in transport._request_streams


def get_stream_writer(transport):
    """What the transport's own router reads to send on its streams, or None once it is closed."""
    return transport._write_stream if holds_get_stream(transport) else None
