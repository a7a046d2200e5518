"""The Recorder: an MCP server to agents and an MCP client to every registered tool server.

`tools/list` is the union of the catalogues, each tool named `server__tool`, with the undo contract's own
tools (`hatp_check`, `hatp_compensate`) hidden. `tools/call` is journaled (intent, then outcome, each in its
own short transaction), forwarded through the one client (`journal.upstream.client`) on the agent session's
own upstream session, and answered as the server sent it, shaped for the agent's protocol version
(`versions`). The rest of MCP is in `features` and `relay`. Agents authenticate with a bearer token, resolved
once per HTTP request by `BearerAgent` and handed to the handlers through the request's ASGI state.

The SDK's server answers everything, except that plain 2026-07-28 `tools/call` requests take `FastCalls`,
which gives the same answer with less work per call (the Recorder's latency is the product's tax on every
agent action). All journal work runs on one thread of its own (`JournalThread`), in the order it was handed
in, committed in groups; a call goes out only once its intent has committed, and its answer goes back only
once its outcome has, so a Recorder killed at any moment loses nothing an agent was told.
"""

import contextlib
import logging
import warnings
from typing import Any

import mcp_types as types
from anyio import get_cancelled_exc_class
from asgiref.sync import sync_to_async
from django.utils import timezone
from mcp.server.caching import CACHEABLE_METHODS, CacheHint
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import methods as _methods
from pydantic import ValidationError

from .. import services
from ..audit import stream as audit_stream
from ..models import Agent, ToolServer
from ..record import idempotency, keys
from ..telemetry import calls, metrics, tracing
from ..undo import declarations, outcomes
from ..upstream import windows
from ..upstream.client import DEFAULT_MAX_ANSWER_BYTES, ToolServerError, Upstreams, endpoint_of
from ..upstream.connection import TASK_RESULT
from . import bridge, holding, opening, versions
from . import earlier as earlier_reads
from .asgi import AnswerAsJson
from .bridge import Bridge
from .bus import Bus, Cancels
from .context import (
    SEPARATOR,
    agent_of,
    client_program,
    enabled_servers,
    forwarded_meta,
    owner_of,
    progress_token,
    recorder_error,
    run_header_of,
    run_key,
    session_of,
    unsendable,
    upstream_error,
)
from .delivery import Deliveries
from .failing import advice_meta, failed, stop_the_run, tool_error, with_advice_text
from .features import Features
from .held_tasks import held_as_task
from .journal_thread import JournalThread, Outcomes
from .listening import Listening
from .relay import Relay, in_call_logs
from .sessions import SessionStore, streamable_app
from .task_calls import TaskCalls, declares_tasks, with_tasks

logger = logging.getLogger(__name__)


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
                tools.append(types.Tool.model_validate({**raw, "name": f"{server.prefix}{SEPARATOR}{name}"}))
            except ValidationError:
                logger.warning("tool %r of %s is not a valid MCP tool; not listed", name, server.name)
    return tools


def _relayed(progress):
    """The server's progress, reported to the agent on the agent's own token. An agent that went away must
    not end the call: the server is already at work, and its answer is still journaled."""
    async def relay(done: float, total: float | None = None, message: str | None = None) -> None:
        with contextlib.suppress(Exception):
            await progress(done, total, message)

    return relay


class Recorder:
    """Every part of the Recorder, wired once, as it is constructed: `sdk_app` is the SDK's streamable HTTP
    app on sessions any process serves, answering as JSON where it can (`asgi.AnswerAsJson`); `lifespan`
    (an async context manager) opens and closes what the parts hold open."""

    def __init__(self, *, timeout: float, idle_seconds: float | None = None, max_sessions: int | None = None,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES, bus_url: str = "", bus_key: bytes = b"",
                 security=None, session_idle_seconds: float | None = None):
        self.journal = JournalThread()
        self.bus = Bus(bus_url, key=bus_key)
        self.cancels = Cancels(self.bus)
        self.bridge = Bridge(orphaned=self._orphaned)
        self.outcomes = Outcomes(self.journal)
        self.deliveries = Deliveries(lost=self.outcomes.not_delivered)
        self.sessions = SessionStore(idle_seconds=session_idle_seconds)
        self.relay = Relay(self.journal, tools_changed=self._tools_changed, bridge=self.bridge, bus=self.bus,
                           streams=self.sessions)
        self.upstreams = Upstreams(
            timeout=timeout,
            idle_seconds=idle_seconds,
            max_sessions=max_sessions,
            max_answer_bytes=max_answer_bytes,
            client_options=self.relay.client_options,
            on_handshake=self.relay.on_handshake,
        )
        self.listening = Listening(self.upstreams, self.relay)
        self.features = Features(journal=self.journal, upstreams=self.upstreams, relay=self.relay,
                                 listening=self.listening, journal_outcome=self.outcomes.write)
        with (
            warnings.catch_warnings()
        ):  # logging is deprecated in 2026-07-28, and still relayed to older agents
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server = Server(
                "agent-undo-recorder",
                version="0.1.0",
                on_list_tools=self.list_tools,
                on_call_tool=self.call_tool,
                # What an agent lists is read for its session and changes with the servers: never reuse it.
                cache_hints={method: CacheHint(ttl_ms=0, scope="private") for method in CACHEABLE_METHODS},
                on_list_resources=self.features.list_resources,
                on_list_resource_templates=self.features.list_resource_templates,
                on_read_resource=self.features.read_resource,
                on_subscribe_resource=self.features.subscribe,
                on_unsubscribe_resource=self.features.unsubscribe,
                on_list_prompts=self.features.list_prompts,
                on_get_prompt=self.features.get_prompt,
                on_completion=self.features.complete,
                on_set_logging_level=self.features.set_logging_level,
                on_subscriptions_listen=self.features.listen,
            )
        self.tasks = TaskCalls(self.journal, self.upstreams, self.features.remember)
        self.tasks.install(self.server)
        # Not JSON-only: a held call streams progress notifications (SSE) while it waits. A request that
        # finishes quickly and emits nothing is still answered with plain JSON. Any process serves any
        # session.
        mcp_app = streamable_app(self.server, path="/mcp/", security=security, store=self.sessions,
                                 idle_seconds=session_idle_seconds, around=self.lifespan())
        # The SDK answers with an event stream; a stream that would carry only its answer goes out as JSON.
        self.sdk_app = AnswerAsJson(mcp_app, self.deliveries, self.sessions, self.cancels)

    @contextlib.asynccontextmanager
    async def lifespan(self):
        # The signing key is created on the Recorder's first start, not at its first checkpoint.
        await self.journal.run(keys.signing_key)
        streamer = audit_stream.started()  # the audit stream, when AUDIT_STREAM names sinks
        try:
            async with self.upstreams, self.listening, self.bus:
                await self.tasks.resume(self._complete)  # tasks in flight before this start are followed too
                try:
                    yield
                finally:
                    await self.tasks.close()
        finally:
            self.journal.close()  # runs every queued journal write first
            if streamer is not None:
                streamer.stop()
            metrics.process_ended()
            tracing.flush()

    async def _tools_changed(self, owner, server_name: str) -> None:
        """A server said its tools changed: its catalogue is read again (on the session that said so)."""
        server = await self.journal.run(self.journal.servers.get, name=server_name)
        if server is None:
            return
        try:
            tools = await self.upstreams.list_tools(endpoint_of(server), owner=owner)
        except ToolServerError as exc:
            logger.warning("could not read %s's changed tools: %s", server_name, exc.message)
            return
        await self.journal.run(services.save_catalogue, server=server, tools=tools)

    async def list_tools(self, ctx, params) -> types.ListToolsResult:
        agent, session_id = agent_of(ctx), session_of(ctx)
        owner = owner_of(agent, session_id, ctx.meta)
        self.relay.heard_from(owner, ctx.session)
        # Not on the journal thread: a read has no reason to queue behind the journal's writes.
        servers = await sync_to_async(enabled_servers)()
        self.listening.keep(owner, servers)  # a handshake session hears list changes of stateless servers too
        if self.relay.answers_requests(owner) or self.relay.heard_capabilities(owner, ctx.meta):
            # A server may offer tools only to clients that can answer its requests: this agent's list is
            # read on its own sessions, which declared what the agent declared (the kept catalogue did not).
            servers = await self.features.live_catalogues(owner, servers)
        return types.ListToolsResult(tools=agent_tools(servers))

    async def call_tool(self, ctx, params: types.CallToolRequestParams):
        agent, session_id = agent_of(ctx), session_of(ctx)
        self.relay.heard_from(owner_of(agent, session_id, ctx.meta), ctx.session)
        sent = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        retry = {key: sent[key] for key in ("inputResponses", "requestState") if key in sent}
        with self.cancels.watch(session_id, ctx.request_id) as watched:  # cancelled in any process's hearing
            result, journaled = await self.forward(agent=agent, name=params.name, arguments=params.arguments,
                                                   meta=ctx.meta, session_id=session_id,
                                                   version=ctx.session.protocol_version,
                                                   progress=ctx.session.report_progress, session=ctx.session,
                                                   retry=retry or None, logged=in_call_logs(ctx),
                                                   run_header=run_header_of(ctx), request_id=ctx.request_id,
                                                   sdk=True)
        if watched.cancelled_caught:
            raise recorder_error(-32800, "The agent cancelled the call.", reason="cancelled",
                                 advice=failed("unknown", may_have_acted=True))
        if journaled is not None:
            await journaled
            if session_id is not None:  # whether the answer reaches the agent is known once its POST ends
                await self.deliveries.answered(session_id, ctx.request_id, journaled)
        return result

    async def forward(self, *, agent: Agent, request_id=None, sdk: bool = False, **call):
        """One tools/call (`_forward`). An agent whose framework drops `_meta` (LangChain's ToolMessage,
        pydantic-ai's tool return) may be given the advice on a failed call as a text block too, if an
        admin said so for it (`Agent.advice_in_content`; off by default: faithful means nothing added).
        The call is observed (`telemetry.calls`): its span, and its count once its answer is journaled."""
        observed = calls.ObservedCall(call["name"], agent=agent.name, session_id=call.get("session_id"),
                                      request_id=request_id, version=call["version"], meta=call.get("meta"),
                                      adopt=sdk)
        try:
            with observed:
                result, journaled = await self._forward(agent=agent, **call)
        except BaseException as exc:
            observed.failed_with(exc)
            observed.end()
            raise
        observed.answered(result, own_error=isinstance(result, types.CallToolResult))
        observed.end_after(journaled.future if journaled is not None else None)
        return (with_advice_text(result) if agent.advice_in_content else result), journaled

    async def _forward(self, *, agent: Agent, name: str, arguments: Any, meta: Any, session_id: str | None,
                       version: str, progress=None, session=None, retry: dict | None = None, logged=None,
                       run_header: str | None = None):
        """Journal, forward and journal one tools/call for an agent on protocol `version`. The result goes
        back as the server sent it, shaped for the agent's version where the versions differ
        (`versions.for_client`); a failure comes back as a tool error, and a JSON-RPC error from the server
        as the same JSON-RPC error. An answer that cannot reach the agent is journaled as undelivered (the
        server acted) and the agent gets a JSON-RPC error of the Recorder's own.
        The autonomy policy decides first: a denied call is answered with a tool error and never forwarded;
        a call the policy asks about waits for approvers (`holding.hold`; for a 2026 agent that declared the
        tasks extension, as a task: `held_tasks`), reporting progress when the agent asked for it.

        Returns the result (the Recorder's own tool error, or the server's answer as the agent gets it) and
        the journal write of its outcome, already queued (None when nothing was journaled): the caller
        awaits it before replying. While the call is in flight, what the server asks the agent (elicitation,
        sampling, roots) goes on `session`, the agent's request's. `retry` is a 2026-07-28 agent's answer to
        a server's `input_required` result, passed on as it sent it; an agent on the handshake is asked the
        server's embedded requests itself (`bridge.answered`)."""
        server_name, separator, tool = name.partition(SEPARATOR)
        if not separator or not tool:
            return tool_error(f"Unknown tool {name!r}: tools are named server{SEPARATOR}tool.",
                              failed("not_found")), None
        if tool in declarations.HIDDEN_TOOLS:
            return tool_error(f"{tool} is reserved for the undo service and not available to agents.",
                              failed("permission")), None
        owner = owner_of(agent, session_id, meta)
        if retry and (resumed := self.bridge.resume(owner, retry)) is not None:
            return await resumed  # the agent answers what the server asked in a call still in flight
        arguments = dict(arguments or {})
        # The agent's own idempotency key goes on in its namespace: it can be neither another agent's key nor
        # one of the Recorder's (journal.record.idempotency).
        kept_meta = idempotency.namespaced_meta(forwarded_meta(meta), agent.pk)
        if (refusal := unsendable(arguments, kept_meta, server_name)) is not None:
            return tool_error(refusal, failed("invalid_arguments")), None
        started = timezone.now()
        begin = dict(servers=self.journal.servers, agent=agent, server_name=server_name, tool=tool,
                     arguments=arguments, key=run_key(meta, session_id, agent.runs_by, run_header),
                     request_meta=kept_meta, now=started, client=client_program(meta, session))
        opened = await opening.open_call(
            self.journal, self.upstreams, begin, owner,
            never_sent=lambda opened: self.outcomes.cancelled(opened, started, sent=False))
        if opened is None:
            return tool_error(f"Unknown tool server {server_name!r}.", failed("not_found")), None
        observed = calls.current()
        observed.opened(opened)
        decision = (opened.policy or {}).get("decision", "allow")
        if decision == "deny":
            message = f"Not done: {opened.policy.get('reason')} Nothing was sent to {opened.server.name}."
            advice = failed("policy", held="denied")
            await self.journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now(),
                                   advice=advice.as_wire())
            return tool_error(message, advice), None
        tasks = version in versions.MODERN and declares_tasks(meta)  # the tasks extension, for this call
        if decision == "ask" and tasks:  # the wait for approvers, as a task
            observed.mark("held")
            return await held_as_task(self.journal, self.upstreams, self.tasks.held, self._complete,
                                      agent=agent, opened=opened, started=started, owner=owner,
                                      arguments=arguments, version=version), None
        if decision == "ask":
            refusal, opened, kept_meta = await holding.approved(
                self.journal, self.upstreams, agent, opened, arguments, owner, progress,
                never_sent=lambda opened: self.outcomes.cancelled(opened, started, sent=False))
            if refusal is not None:
                observed.after_hold(refusal)  # held when told to come back once approved, else refused
                return tool_error(*refusal), None
        work = self._complete(opened, started, owner=owner, session=session, tool=tool, arguments=arguments,
                              meta=kept_meta, version=version, retry=retry, logged=logged,
                              tasks=tasks,
                              progress=progress if progress_token(meta) is not None else None)
        if (
            version in versions.MODERN
            and self.relay.heard_capabilities(owner, meta)
            and self.bridge.free(owner)
        ):
            return await self.bridge.start(owner, work)  # a server that asks gets its answer by a retry
        return await work

    async def _complete(
        self,
        opened: services.OpenedStep,
        started,
        *,
        owner,
        session,
        tool: str,
        arguments: dict,
        meta: dict | None,
        version: str,
        retry: dict | None,
        progress,
        logged=None,
        tasks: bool = False,
    ):
        """Forward the journaled call and journal what came of it (see `forward`). `tasks`: the agent declared
        the tasks extension on this call, so the server is told it may answer with a task handle."""
        server_name = opened.server.name
        sent = []
        window = await earlier_reads.window(opened.server, opened.earlier)  # a database's, for writing SQL
        try:
            with self.relay.call(owner, session, opened) as relaying:
                # A server may wait on the agent (a person answering an elicitation): that time is not its
                # own.
                waits = self.upstreams.timeout + bridge.ANSWER_SECONDS if self.relay.can_ask(owner) else None
                with calls.upstream_span(server_name, tool):
                    result = await self.upstreams.call_tool(
                        endpoint_of(opened.server), tool, arguments, meta=tracing.with_trace(meta),
                        owner=owner, timeout=waits, sending=lambda: sent.append(True), retry=retry,
                        progress=_relayed(progress) if progress is not None else None, logged=logged,
                        capabilities=with_tasks(self.relay.capabilities_of(owner), tasks))
                if result.get("resultType") == versions.INPUT_REQUIRED and version not in versions.MODERN:
                    result = await bridge.answered(self.relay, self.upstreams, result, owner, opened, tool,
                                                   arguments, meta)
        except get_cancelled_exc_class():
            # The agent cancelled (notifications/cancelled, or its 2026 request's connection closed). Leaving
            # the upstream call tells the server at once: the SDK sends notifications/cancelled on a
            # handshake session, and a 2026 request's connection closes. Once the server had the call it may
            # have acted: the journal says exactly that, never leaving the step for the reconciler to guess.
            windows.release(window)
            self.outcomes.cancelled(opened, started, sent=bool(sent))
            raise
        except ToolServerError as exc:
            rows = await earlier_reads.rows_after(window, opened.earlier, server_name,
                                                  unanswered=exc.may_have_acted)
            calls.current().upstream_failed(exc)
            if (
                exc.oversized is not None
            ):  # the server answered: it acted, but nothing of its answer is relayed
                calls.current().mark("not_relayed", "oversized")
                message = f"{exc.message}. The server may have acted; do not repeat the call blindly."
                advice = failed("unknown", opened.traits, may_have_acted=True, answered=True)
                return tool_error(message, advice), self.outcomes.write(opened, started, services.Outcome(
                    undelivered=message, oversized=exc.oversized, recovery=advice.as_wire(),
                    after_state=rows))
            advice = failed(exc.failure_class, opened.traits, may_have_acted=exc.may_have_acted,
                            retry_after=exc.retry_after)
            journaled = self.outcomes.write(opened, started, services.Outcome(
                error_message=exc.message, failure_class=exc.failure_class, may_have_acted=exc.may_have_acted,
                recovery=advice.as_wire(), after_state=rows))
            saga = await stop_the_run(opened, journaled)
            if exc.code is not None and exc.failure_class != "transient":
                # A JSON-RPC error from the server goes back as the same JSON-RPC error; the advice is
                # journaled.
                await journaled
                raise upstream_error(exc) from None
            acted = exc.may_have_acted
            note = " It may have acted before failing; do not repeat the call blindly." if acted else ""
            return tool_error(f"{exc.message} ({exc.failure_class}).{note}", advice, saga), journaled
        except Exception:
            windows.release(window)  # nothing a failure here leaves may keep the database's window
            raise
        # The rows it changed, for a database's SQL.
        rows = await earlier_reads.rows_after(window, opened.earlier, server_name)
        if result.get("resultType") == TASK_RESULT:  # the tasks extension: the call goes on as a task
            calls.current().mark("task")
            return await self.tasks.started(opened, started, result, declared=tasks, owner=owner), None
        relayed = versions.from_server(result)
        self.features.remember(owner, server_name, relayed)
        try:  # shaped for the agent's version, then through the SDK's own sieve for it, as a reply would be
            delivered = _methods.serialize_server_result(
                "tools/call", version, versions.for_client(relayed, version=version))
        except (versions.Untranslatable, ValidationError, KeyError, ValueError) as exc:
            why = exc.message if isinstance(exc, versions.Untranslatable) else (
                f"it is not a tools/call result of protocol {version}")
            message = (
                f"{server_name} answered, but its answer cannot be delivered: {why}. The server may have "
                "acted; do not repeat the call blindly."
            )
            advice = failed("unknown", opened.traits, may_have_acted=True, answered=True)
            calls.current().mark("not_relayed", "untranslatable")
            await self.outcomes.write(opened, started, services.Outcome(result=relayed, undelivered=message,
                                                                         recovery=advice.as_wire()))
            raise recorder_error(-32603, message, reason="undelivered", advice=advice) from None
        if relayed.get("isError") is True:  # the server's own tool error: advice added, nothing else changed
            advice = failed("unknown", opened.traits, relay_failed=relaying.failed) if relaying.failed \
                else failed(outcomes.classify_tool_error(relayed), opened.traits)
            journaled = self.outcomes.write(opened, started, services.Outcome(
                result=relayed, recovery=advice.as_wire(), after_state=rows))
            saga = await stop_the_run(opened, journaled)
            delivered["_meta"] = advice_meta(advice, delivered.get("_meta"), saga)
            return delivered, journaled
        version, state = await earlier_reads.after(self.upstreams, opened.server, opened.earlier, owner)
        return delivered, self.outcomes.write(opened, started, services.Outcome(
            result=relayed, after_version=version, after_state=rows or state))

    async def _orphaned(self, outcome) -> None:
        """A 2026 agent was asked something in a call and never came back: the call's answer never reached
        it."""
        _, journaled = outcome
        if journaled is not None:
            await self.outcomes.not_delivered(
                journaled,
                "The server asked the agent a question, and the agent never came "
                "back with its answer; the server may have acted.",
            )

    def session_ended(self, agent: Agent, session_id: str) -> None:
        """The agent ended its MCP session: so end its upstream sessions (a stdio server's process stops), and
        its record, which other processes serve it by."""
        owner = owner_of(agent, session_id)
        self.upstreams.close_owner(owner)
        self.relay.forget(owner)
        self.listening.forget(owner)
        self.deliveries.forget(session_id)
        self.sessions.ended(session_id)
        # In every process: "Session not found" from now.
        self.journal.submit(services.forget_agent_session, session_id=session_id)
