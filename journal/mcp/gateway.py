"""The Recorder: an MCP server to agents and an MCP client to every registered tool server.

`tools/list` is the union of the catalogues, each tool named `server__tool`, with the undo contract's own
tools (`hatp_check`, `hatp_compensate`) hidden. `tools/call` is journaled (intent, then outcome, each in
its own short transaction), forwarded through the one client (`journal.mcp.client`), and its result goes
back to the agent unchanged. Agents authenticate with a bearer token; the agent is resolved once per HTTP
request by `BearerAgent` and handed to the handlers through the request's ASGI state.
"""

import contextlib
import logging
import time
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from .. import declarations, keys, services
from ..models import Agent, ToolServer
from .client import Endpoint, ToolServerError, Upstreams

logger = logging.getLogger(__name__)

SEPARATOR = "__"
RUN_ID_KEY = "runId"
_ENVELOPE_PREFIX = "io.modelcontextprotocol/"


def endpoint_of(server: ToolServer) -> Endpoint:
    return Endpoint(name=server.name, transport=server.transport, url=server.url, command=server.command)


def agent_tools(servers: list[ToolServer]) -> list[types.Tool]:
    """The agent's view of every catalogue. A catalogue entry that is not a valid MCP tool is left out
    (and logged) rather than passed on: the agent should never see what the server could not describe."""
    tools = []
    for server in servers:
        for raw in server.catalogue:
            name = raw.get("name") if isinstance(raw, dict) else None
            if not isinstance(name, str) or name in declarations.HIDDEN_TOOLS:
                continue
            try:
                tools.append(types.Tool.model_validate({**raw, "name": f"{server.name}{SEPARATOR}{name}"}))
            except ValidationError:
                logger.warning("tool %r of %s is not a valid MCP tool; not listed", name, server.name)
    return tools


def _enabled_servers() -> list[ToolServer]:
    return list(ToolServer.objects.filter(enabled=True))


def _begin(*, agent: Agent, server_name: str, tool: str, arguments: dict, ctx_run_key: str,
           request_meta: dict | None, now) -> services.OpenedStep | None:
    """Find the server and journal the intent in one trip to the database thread."""
    server = ToolServer.objects.filter(name=server_name, enabled=True).first()
    if server is None:
        return None
    return services.open_step(agent=agent, run_key=ctx_run_key, server=server, server_name=server_name, tool=tool,
                              arguments=arguments, request_meta=request_meta, now=now)


def _agent(ctx) -> Agent:
    request = ctx.request
    agent = request.scope.get("state", {}).get("agent") if request is not None else None
    if agent is None:  # BearerAgent guards the route, so this is a wiring bug, not a client error
        raise MCPError(code=-32603, message="No authenticated agent on this request")
    return agent


def _run_key(ctx) -> str:
    meta = ctx.meta or {}
    journal = meta.get(declarations.HATP_KEY) if isinstance(meta, dict) else None
    run_id = journal.get(RUN_ID_KEY) if isinstance(journal, dict) else None
    if isinstance(run_id, str) and run_id.strip():
        return "run:" + run_id.strip()[:190]
    session = ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None
    return "session:" + session[:180] if session else ""


def _forwarded_meta(ctx) -> dict[str, Any] | None:
    """The agent's `_meta`, minus the protocol envelope the SDK writes for each hop itself."""
    meta = ctx.meta if isinstance(ctx.meta, dict) else {}
    kept = {k: v for k, v in meta.items() if not k.startswith(_ENVELOPE_PREFIX) and k != "progressToken"}
    return kept or None


def tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class Recorder:
    def __init__(self, *, timeout: float):
        self.upstreams = Upstreams(timeout=timeout)
        self.server = Server(
            "agent-undo-recorder", version="0.1.0", on_list_tools=self.list_tools, on_call_tool=self.call_tool
        )

    async def list_tools(self, ctx, params) -> types.ListToolsResult:
        _agent(ctx)
        servers = await sync_to_async(_enabled_servers)()
        return types.ListToolsResult(tools=agent_tools(servers))

    async def call_tool(self, ctx, params: types.CallToolRequestParams):
        agent = _agent(ctx)
        server_name, separator, tool = params.name.partition(SEPARATOR)
        if not separator or not tool:
            return tool_error(f"Unknown tool {params.name!r}: tools are named server{SEPARATOR}tool.")
        if tool in declarations.HIDDEN_TOOLS:
            return tool_error(f"{tool} is reserved for the undo service and not available to agents.")
        arguments = dict(params.arguments or {})
        started = timezone.now()
        opened = await sync_to_async(_begin)(
            agent=agent, server_name=server_name, tool=tool, arguments=arguments, ctx_run_key=_run_key(ctx),
            request_meta=_forwarded_meta(ctx), now=started,
        )
        if opened is None:
            return tool_error(f"Unknown tool server {server_name!r}.")
        try:
            result = await self.upstreams.call_tool(
                endpoint_of(opened.server), tool, arguments, meta=_forwarded_meta(ctx)
            )
        except ToolServerError as exc:
            await sync_to_async(services.close_step)(
                opened=opened, started=started, finished=timezone.now(),
                outcome=services.Outcome(error_message=exc.message, failure_class=exc.failure_class,
                                         may_have_acted=exc.may_have_acted),
            )
            if exc.code is not None and exc.failure_class != "transient":
                # A JSON-RPC error from the server goes back as the same JSON-RPC error.
                raise MCPError(code=exc.code, message=exc.message) from None
            note = " It may have acted before failing; do not repeat the call blindly." if exc.may_have_acted else ""
            return tool_error(f"{exc.message} ({exc.failure_class}).{note}")
        await sync_to_async(services.close_step)(
            opened=opened, outcome=services.Outcome(result=result), started=started, finished=timezone.now()
        )
        return result


class BearerAgent:
    """Authenticate the agent from `Authorization: Bearer …` before any MCP processing.

    A token's agent is remembered for AUTH_TTL seconds, so an agent's burst of calls costs one lookup;
    deactivating an agent (or its user) therefore takes effect within that many seconds. Refusals are
    never remembered, so a new agent works at once.
    """

    AUTH_TTL = 5.0

    def __init__(self, app):
        self.app = app
        self._known: dict[str, tuple[Agent, float]] = {}

    async def _agent_for(self, token: str) -> Agent | None:
        key = services.hash_token(token)
        known = self._known.get(key)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        agent = await sync_to_async(services.authenticate_agent)(token)
        if agent is None:
            self._known.pop(key, None)
            return None
        if len(self._known) > 10_000:  # bounded: one entry per live token is all it ever needs
            self._known.clear()
        self._known[key] = (agent, time.monotonic() + self.AUTH_TTL)
        return agent

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        agent = await self._agent_for(token.strip()) if scheme.lower() == "bearer" else None
        if agent is None:
            response = JSONResponse(
                {"error": "invalid_token", "error_description": "Send the agent's token as 'Authorization: Bearer agt_…'."},
                status_code=401, headers={"WWW-Authenticate": 'Bearer realm="recorder"'},
            )
            return await response(scope, receive, send)
        scope.setdefault("state", {})["agent"] = agent
        await self.app(scope, receive, send)


def _transport_security() -> TransportSecuritySettings:
    hosts = [h for h in settings.ALLOWED_HOSTS if h and h != "*"]
    if "*" in settings.ALLOWED_HOSTS:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
        allowed_origins=[f"{scheme}://{h}{port}" for h in hosts for scheme in ("http", "https") for port in ("", ":*")],
    )


def build_app() -> Starlette:
    recorder = Recorder(timeout=settings.TOOL_SERVER_TIMEOUT)
    mcp_app = recorder.server.streamable_http_app(
        streamable_http_path="/mcp/", json_response=True, transport_security=_transport_security()
    )

    session_manager_lifespan = mcp_app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # The signing key is created on the Recorder's first start, not at its first checkpoint.
        await sync_to_async(keys.signing_key)()
        async with recorder.upstreams, session_manager_lifespan(app):
            yield

    mcp_app.router.lifespan_context = lifespan
    app = BearerAgent(mcp_app)
    app.recorder = recorder  # type: ignore[attr-defined]
    return app
