"""The Recorder: an MCP server to agents and an MCP client to every registered tool server.

`tools/list` is the union of the catalogues, each tool named `server__tool`, with the undo contract's own
tools (`hatp_check`, `hatp_compensate`) hidden. `tools/call` is journaled (intent, then outcome, each in
its own short transaction), forwarded through the one client (`journal.mcp.client`), and its result goes
back to the agent unchanged. Agents authenticate with a bearer token; the agent is resolved once per HTTP
request by `BearerAgent` and handed to the handlers through the request's ASGI state.

The SDK's server answers everything, except that plain 2026-07-28 `tools/call` requests take `FastCalls`,
which gives the same answer with less work per call (the Recorder's latency is the product's tax on every
agent action). All journal work runs on one thread of its own (`JournalThread`), in the order it was handed
in; the outcome of a call is queued before its answer goes back, so it is journaled before anything the
agent does next, but the answer does not wait for the commit.
"""

import asyncio
import contextlib
import functools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.utils import timezone
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, encode_header_value
from mcp_types import PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import declarations, keys, services, sql
from ..models import Agent, ToolServer
from .asgi import read_body
from .client import ToolServerError, Upstreams, endpoint_of

logger = logging.getLogger(__name__)

SEPARATOR = "__"
HOLD_POLL_SECONDS = 0.5  # how often a held call looks for the approvers' decision
RUN_ID_KEY = "runId"
_ENVELOPE_PREFIX = "io.modelcontextprotocol/"


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


class JournalThread:
    """The Recorder's journal work, on one thread with one database connection of its own.

    Jobs run one at a time in the order they were handed in. That order is the guarantee the Recorder
    relies on: a call's outcome is queued before its answer goes back to the agent, so the next call of
    that agent (and a test's `settle`) always finds it journaled, while the answer itself does not wait
    for the commit. Shutting down runs every queued job first, so a restart loses nothing.
    """

    def __init__(self):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recorder-journal")
        self.servers = ServerDirectory()  # only ever touched on this thread

    def _job(self, fn, kwargs):
        try:
            return fn(**kwargs)
        except Exception:
            # A broken connection must not poison every later job; Django reconnects on next use.
            connection.close()
            raise

    def submit(self, fn, /, **kwargs) -> asyncio.Future:
        """Queue `fn(**kwargs)` now; await the future for its result."""
        return asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(self._job, fn, kwargs))

    async def run(self, fn, /, **kwargs):
        return await self.submit(fn, **kwargs)

    def settle(self) -> None:
        """Wait (from any thread) until everything queued so far has run."""
        self._executor.submit(lambda: None).result()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already closed
            self._executor.submit(connection.close)
        self._executor.shutdown(wait=True)


class ServerDirectory:
    """The enabled tool servers by name, each kept until its row's `updated_at` moves.

    A call checks one small indexed row instead of loading and parsing the server's whole catalogue, so a
    catalogue refresh or an admin edit still takes effect on the very next call."""

    def __init__(self):
        self._known: dict[str, tuple[Any, ToolServer]] = {}

    def get(self, name: str) -> ToolServer | None:
        row = sql.first_row(ToolServer, ("id", "updated_at"), "name = %s AND enabled = %s",
                            [name, sql.prep(ToolServer, "enabled", True)])
        if row is None:
            self._known.pop(name, None)
            return None
        pk, stamp = row
        known = self._known.get(name)
        if known is not None and known[0] == stamp:
            return known[1]
        server = ToolServer.objects.filter(pk=pk).first()
        if server is not None:
            self._known[name] = (stamp, server)
        return server


def _begin(*, servers: ServerDirectory, agent: Agent, server_name: str, tool: str, arguments: dict, key: str,
           request_meta: dict | None, now) -> services.OpenedStep | None:
    """Find the server, ask the autonomy policy and journal the intent (with the decision) in one job on the
    journal thread. The policy is read from the tool's own declaration, never from anything the agent sent."""
    from approver import services as approver_services

    server = servers.get(server_name)
    if server is None:
        return None

    def decide(declaration):
        return approver_services.decide_call(agent_name=agent.name, server_name=server_name, tool=tool,
                                             declaration=declaration)

    return services.open_step(agent=agent, run_key=key, server=server, server_name=server_name, tool=tool,
                              arguments=arguments, request_meta=request_meta, now=now, decide=decide)


def _agent(ctx) -> Agent:
    request = ctx.request
    agent = request.scope.get("state", {}).get("agent") if request is not None else None
    if agent is None:  # BearerAgent guards the route, so this is a wiring bug, not a client error
        raise MCPError(code=-32603, message="No authenticated agent on this request")
    return agent


def run_key(meta: Any, session_id: str | None) -> str:
    """Which run a call joins: the agent's runId, else its MCP session, else none (the idle rule)."""
    journal = meta.get(declarations.HATP_KEY) if isinstance(meta, dict) else None
    run_id = journal.get(RUN_ID_KEY) if isinstance(journal, dict) else None
    if isinstance(run_id, str) and run_id.strip():
        return "run:" + run_id.strip()[:190]
    return "session:" + session_id[:180] if session_id else ""


def forwarded_meta(meta: Any) -> dict[str, Any] | None:
    """The agent's `_meta`, minus the protocol envelope each hop writes for itself."""
    meta = meta if isinstance(meta, dict) else {}
    kept = {k: v for k, v in meta.items() if not k.startswith(_ENVELOPE_PREFIX) and k != "progressToken"}
    return kept or None


def tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class Recorder:
    def __init__(self, *, timeout: float):
        self.upstreams = Upstreams(timeout=timeout)
        self.journal = JournalThread()
        self.server = Server(
            "agent-undo-recorder", version="0.1.0", on_list_tools=self.list_tools, on_call_tool=self.call_tool
        )

    async def list_tools(self, ctx, params) -> types.ListToolsResult:
        _agent(ctx)
        # Not on the journal thread: a read has no reason to queue behind the journal's writes.
        servers = await sync_to_async(_enabled_servers)()
        return types.ListToolsResult(tools=agent_tools(servers))

    async def call_tool(self, ctx, params: types.CallToolRequestParams):
        session_id = ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None
        result, journaled = await self.forward(agent=_agent(ctx), name=params.name, arguments=params.arguments,
                                               meta=ctx.meta, session_id=session_id,
                                               progress=ctx.session.report_progress)
        if journaled is not None:
            await journaled
        return result

    async def forward(self, *, agent: Agent, name: str, arguments: Any, meta: Any, session_id: str | None,
                      progress=None):
        """Journal, forward and journal one tools/call; the result dict goes back unchanged, a failure
        comes back as a tool error, and a JSON-RPC error from the server as the same JSON-RPC error.
        The autonomy policy decides first: a denied call is answered with a tool error and never forwarded;
        a call the policy asks about waits for approvers (`_hold`), reporting progress when the agent asked
        for it (`progress(done, total, message)`).

        Returns the result and the journal write of its outcome, already queued (None when nothing was
        journaled): the caller awaits it, after replying if it can."""
        server_name, separator, tool = name.partition(SEPARATOR)
        if not separator or not tool:
            return tool_error(f"Unknown tool {name!r}: tools are named server{SEPARATOR}tool."), None
        if tool in declarations.HIDDEN_TOOLS:
            return tool_error(f"{tool} is reserved for the undo service and not available to agents."), None
        arguments = dict(arguments or {})
        kept_meta = forwarded_meta(meta)
        started = timezone.now()
        opened = await self.journal.run(
            _begin, servers=self.journal.servers, agent=agent, server_name=server_name, tool=tool,
            arguments=arguments, key=run_key(meta, session_id), request_meta=kept_meta, now=started,
        )
        if opened is None:
            return tool_error(f"Unknown tool server {server_name!r}."), None
        decision = (opened.policy or {}).get("decision", "allow")
        if decision == "deny":
            message = f"Not done: {opened.policy.get('reason')} Nothing was sent to {server_name}."
            await self.journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now())
            return tool_error(message), None
        if decision == "ask":
            refusal = await self._hold(agent, opened, arguments, progress)
            if refusal is not None:
                return tool_error(refusal), None
        try:
            result = await self.upstreams.call_tool(endpoint_of(opened.server), tool, arguments, meta=kept_meta)
        except ToolServerError as exc:
            journaled = self._journal_outcome(opened, started, services.Outcome(
                error_message=exc.message, failure_class=exc.failure_class, may_have_acted=exc.may_have_acted))
            if exc.code is not None and exc.failure_class != "transient":
                # A JSON-RPC error from the server goes back as the same JSON-RPC error.
                await journaled
                raise MCPError(code=exc.code, message=exc.message) from None
            note = " It may have acted before failing; do not repeat the call blindly." if exc.may_have_acted else ""
            return tool_error(f"{exc.message} ({exc.failure_class}).{note}"), journaled
        return result, self._journal_outcome(opened, started, services.Outcome(result=result))

    async def _hold(self, agent: Agent, opened: services.OpenedStep, arguments: dict, progress) -> str | None:
        """Wait for approvers to decide on a held call, up to the policy's time. Returns None once the call
        is approved and released (an approval lets exactly one call through), else what to tell the agent.
        Waiting reads the request's state (not on the journal thread: reads never queue behind writes)."""
        from approver import services as approver_services
        from approver.models import ActionRequest  # its states only

        hold = opened.policy.get("hold") or {}
        action = await self.journal.run(
            approver_services.request_for_held_call, agent=agent, server=opened.server, tool=opened.tool,
            arguments=opened.arguments, decision=opened.policy, run_id=opened.run_id, step_id=opened.step_id,
            now=timezone.now())
        url = approver_services.action_url(action)
        read = sync_to_async(lambda: approver_services.held_call_state(action.pk))
        timeout = float(hold.get("askTimeout") or 60)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state, decided_by, decision_reason, expires_at = await read()
            waited = timeout - max(deadline - loop.time(), 0.0)
            if state == ActionRequest.State.APPROVED and await self.journal.run(
                    approver_services.claim_approved_action, action_id=action.pk, step_id=opened.step_id):
                await self.journal.run(services.release_held_step, opened=opened, now=timezone.now(),
                                       approval={"action": str(action.public_id), "approvedBy": decided_by})
                return None
            if state == ActionRequest.State.DENIED:
                message = f"Not done: {decided_by} denied this call: “{decision_reason}”. Nothing was sent."
            elif state == ActionRequest.State.USED:
                message = f"Not done: the approval at {url} already let an identical call through; ask again."
            elif state == ActionRequest.State.EXPIRED or expires_at <= timezone.now():
                message = f"Not done: the approval request at {url} expired. Make the call again to ask anew."
            elif loop.time() >= deadline:
                message = (f"Not done yet: this call awaits approval at {url} ({opened.policy.get('reason')}) "
                           "Make the same call again, with the same arguments, once it is approved.")
            else:
                if progress is not None:
                    with contextlib.suppress(Exception):  # a client that went away must not end the hold
                        await progress(waited, timeout, f"Waiting for approval: {url}")
                await asyncio.sleep(HOLD_POLL_SECONDS)
                continue
            await self.journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now())
            return message

    def _journal_outcome(self, opened: services.OpenedStep, started, outcome: services.Outcome):
        """Queue the outcome's journal write now (so it comes before anything the agent does next) and
        return an awaitable for it."""
        written = self.journal.submit(services.close_step, opened=opened, outcome=outcome, started=started,
                                      finished=timezone.now())
        return self._outcome_written(written, opened)

    @staticmethod
    async def _outcome_written(written: asyncio.Future, opened: services.OpenedStep) -> None:
        """The tool server has already acted, so a database failure here must not turn its answer into an
        error (the agent would retry and act twice): the step stays `pending` in the record, and
        `journal.reconcile_stale_steps` later marks it as acted-but-unrecorded."""
        try:
            await written
        except Exception:
            logger.exception("could not journal the outcome of step %s of run %s; the reconciler will mark it",
                             opened.number, opened.run_id)


class BearerAgent:
    """Authenticate the agent from `Authorization: Bearer …` before any MCP processing.

    A token's agent is remembered for AUTH_TTL seconds, so an agent's burst of calls costs one lookup;
    deactivating an agent (or its user) therefore takes effect within that many seconds. Refusals are
    never remembered, so a new agent works at once.
    """

    AUTH_TTL = 5.0

    def __init__(self, app, fast_calls: "FastCalls | None" = None):
        self.app = app
        self.fast_calls = fast_calls
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
        if self.fast_calls is not None and await self.fast_calls.handle(agent, scope, receive, send):
            return
        await self.app(scope, receive, send)


class FastCalls:
    """`tools/call` on the stateless 2026-07-28 protocol, answered without the SDK's per-request machinery.

    This is the Recorder's hot path: an agent's call costs one JSON parse, the journal and the upstream call.
    Only plain, well-formed requests take it (JSON in and out, no session, no progress token, no extra
    parameters, headers that agree with the body, within the body limit, passing the same host and origin
    checks). Everything else, including every malformed request, goes to the SDK, which answers it as it
    would have anyway. Replies are built with the SDK's own result sieve, error table and serverInfo stamp,
    so a client cannot tell which path answered.
    """

    def __init__(self, recorder: "Recorder", security: TransportSecuritySettings):
        self.recorder = recorder
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
            request.get("jsonrpc") == "2.0" and request.get("method") == "tools/call"
            and set(request) == {"jsonrpc", "id", "method", "params"}
            and (isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)))
            and set(params) <= {"name", "arguments", "_meta"}
            and isinstance(params.get("name"), str) and name_header == encode_header_value(params["name"])
            and isinstance(params.get("arguments", {}), dict)
            and isinstance(meta, dict) and meta.get(PROTOCOL_VERSION_META_KEY) == version
            and "progressToken" not in meta
        )
        return request if plain else None

    async def handle(self, agent: Agent, scope, receive, send) -> bool:
        """Answer the request and return True, or return False having consumed nothing."""
        version = self._candidate(scope)
        if version is None:
            return False
        body = await read_body(receive)
        name_header = dict(scope.get("headers") or []).get(b"mcp-name", b"").decode("latin-1") or None
        request = self._request(body, version, name_header)
        if request is None or await self.security.validate_request(Request(scope), is_post=True) is not None:
            # Hand the untouched body to the SDK, which gives the standard answer.
            replay = iter([{"type": "http.request", "body": body, "more_body": False}])

            async def replayed():
                return next(replay, None) or await receive()

            await self.recorder.sdk_app(scope, replayed, send)
            return True
        params = request["params"]
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        status = 200
        journaled = None
        accept = dict(scope.get("headers") or []).get(b"accept", b"").decode("latin-1")
        stream = _HeldStream(send) if "text/event-stream" in accept else None
        try:
            result, journaled = await self.recorder.forward(
                agent=agent, name=params["name"], arguments=params.get("arguments"), meta=params["_meta"],
                session_id=None, progress=stream.keep_alive if stream else None)
            if isinstance(result, types.CallToolResult):
                result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            wire = _methods.serialize_server_result("tools/call", version, result)
            wire_meta = wire.get("_meta") if isinstance(wire.get("_meta"), dict) else {}
            if wire_meta.get(SERVER_INFO_META_KEY) is None:
                wire["_meta"] = {**wire_meta, SERVER_INFO_META_KEY: self.recorder.server.server_info_stamp}
            reply["result"] = wire
        except MCPError as exc:
            reply["error"] = exc.error.model_dump(mode="json", by_alias=True, exclude_none=True)
            status = ERROR_CODE_HTTP_STATUS.get(exc.error.code, 200)
        except ValidationError:
            logger.exception("a tools/call result did not fit the %s result schema", version)
            reply["error"] = {"code": -32603, "message": "Handler returned an invalid result"}
        except Exception:  # as the SDK does: log it, and never let internals reach the wire
            logger.exception("tools/call failed inside the Recorder")
            reply["error"] = {"code": -32603, "message": "Internal server error"}
        self.answered += 1
        try:
            if stream is not None and stream.open:
                await stream.finish(reply)
            else:
                await Response(json.dumps(reply, separators=(",", ":")), status_code=status,
                               media_type="application/json")(scope, receive, send)
        finally:
            if journaled is not None:  # queued before the reply, so it is journaled before the agent's next call
                await journaled
        return True


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
        await self.send({"type": "http.response.body", "body": f"event: message\r\ndata: {data}\r\n\r\n".encode(),
                         "more_body": False})


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
    security = _transport_security()
    mcp_app = recorder.server.streamable_http_app(
        # Not JSON-only: a held call streams progress notifications (SSE) while it waits. A request that
        # finishes quickly and emits nothing is still answered with plain JSON.
        streamable_http_path="/mcp/", json_response=False, transport_security=security
    )
    recorder.sdk_app = mcp_app

    session_manager_lifespan = mcp_app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # The signing key is created on the Recorder's first start, not at its first checkpoint.
        await recorder.journal.run(keys.signing_key)
        try:
            async with recorder.upstreams, session_manager_lifespan(app):
                yield
        finally:
            recorder.journal.close()  # runs every queued journal write first

    mcp_app.router.lifespan_context = lifespan
    app = BearerAgent(mcp_app, FastCalls(recorder, security) if settings.RECORDER_FAST_CALLS else None)
    app.recorder = recorder  # type: ignore[attr-defined]
    return app
