"""What tool servers send an agent on their own: notifications (log messages, list changes, updates of
subscribed resources) and requests (elicitation, sampling, `roots/list`), relayed to the agent session
whose upstream session they came on.

Each agent session has its own upstream sessions (`client.Upstreams`), so whatever arrives on one belongs
to exactly one agent session. The Recorder declares to each upstream the capabilities the agent declared,
so a server only asks what the agent can answer; a request arriving while the agent has a call in flight
goes on that call's stream, and is journaled with the call's step. A stateless 2026-07-28 agent has no
channel back but what it opens: it is asked by the answer to its call (`bridge`), and hears list changes
and resource updates on its `subscriptions/listen` streams.
"""

import asyncio
import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.utils import timezone
from mcp import MCPError
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import services
from ..upstream.client import Owner
from .sessions import SessionStore

logger = logging.getLogger(__name__)

# What a server may ask an agent, by method: the request and result models, and the capability it needs.
ASKS = {
    "elicitation/create": (types.ElicitRequest, types.ElicitResult, "elicitation"),
    "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult, "sampling"),
    "roots/list": (types.ListRootsRequest, types.ListRootsResult, "roots"),
}

_RELAYED_NOTIFICATIONS = (
    types.LoggingMessageNotification,
    types.ToolListChangedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
)


@dataclass
class _Call:
    session: Any  # the SDK's ServerSession of the agent's request: its stream reaches the agent
    step: services.OpenedStep | None
    failed: str = ""  # why the Recorder itself could not put one of the server's questions to the agent


# A notification as the event a 2026-07-28 agent's `subscriptions/listen` stream carries.
_EVENTS = {
    types.ToolListChangedNotification: ToolsListChanged,
    types.PromptListChangedNotification: PromptsListChanged,
    types.ResourceListChangedNotification: ResourcesListChanged,
}
_LISTENERS = 1024


def in_call_logs(ctx) -> tuple[str, Any] | None:
    """For a 2026-07-28 agent that asked for a call's log messages (`_meta`'s log level): the level, and
    what puts each of the server's log messages about the call on the agent's own request stream. (A
    handshake agent hears them on its upstream session, like anything else its servers send it.)"""
    meta = ctx.meta if isinstance(ctx.meta, dict) else {}
    level = meta.get(types.LOG_LEVEL_META_KEY)
    if not isinstance(level, str) or ctx.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return None

    async def relay(params: dict) -> None:
        with contextlib.suppress(Exception):  # a malformed entry, or an agent gone: not the call's failure
            await ctx.session.send_log_message(params.get("level"), params.get("data"), params.get("logger"),
                                               related_request_id=ctx.request_id)

    return level, relay


def _answers(capabilities: types.ClientCapabilities) -> bool:
    return any(c is not None for c in (capabilities.elicitation, capabilities.sampling, capabilities.roots))


class Relay:
    def __init__(
        self, journal, tools_changed=None, bridge=None, bus=None, streams: SessionStore | None = None
    ):
        self.journal = journal
        # Handshake sessions' GET streams, which may be in another process (`sessions.SessionStore`), and the
        # bus that reaches it; without them, a notification goes on this process's session only.
        self.streams = streams
        self.bus = bus
        if bus is not None:
            bus.on("notify", self._heard)
        self.bridge = bridge  # how a 2026-07-28 agent is asked: by the answer to its call (`bridge.Bridge`)
        self.declared: dict[Owner, types.ClientCapabilities] = {}  # what each 2026 agent last declared
        self._raw_declared: dict[Owner, Any] = {}
        self.tools_changed = tools_changed  # async (owner, server name): a server said its tools changed
        self._pending_reads: set[asyncio.Task] = set()
        self.sessions: weakref.WeakValueDictionary[Owner, Any] = weakref.WeakValueDictionary()
        self.calls: dict[Owner, list[_Call]] = {}
        self.subscriptions: dict[
            tuple[Owner, str, str], str
        ] = {}  # (owner, server, its URI): the agent's URI
        # A 2026-07-28 agent's `subscriptions/listen` streams, fed from its own upstream sessions only.
        self.buses: dict[Owner, tuple[InMemorySubscriptionBus, ListenHandler]] = {}

    def listener(self, owner: Owner) -> ListenHandler:
        """The handler serving `owner`'s listen streams (each agent session has its own bus)."""
        if owner not in self.buses:
            if len(self.buses) >= _LISTENERS:
                del self.buses[next(iter(self.buses))]
            bus = InMemorySubscriptionBus()
            self.buses[owner] = (bus, ListenHandler(bus, max_subscriptions=16))
        return self.buses[owner][1]

    def heard_from(self, owner: Owner, session) -> None:
        """The agent session behind `owner` just sent a request on `session`."""
        if session is not None and session.client_params is not None \
                and session.protocol_version not in MODERN_PROTOCOL_VERSIONS:  # the handshake: a channel back
            self.sessions[owner] = session

    @contextlib.contextmanager
    def call(self, owner: Owner, session, step: services.OpenedStep | None):
        """While the agent's call is in flight, what its servers ask goes on its stream."""
        call = _Call(session, step)
        self.calls.setdefault(owner, []).append(call)
        try:
            yield call
        finally:
            calls = self.calls.get(owner) or []
            if call in calls:
                calls.remove(call)
            if not calls:
                self.calls.pop(owner, None)

    def heard_capabilities(self, owner: Owner, meta: Any) -> bool:
        """A 2026-07-28 agent's request declares its capabilities in its `_meta`: keep them (its upstream
        sessions declare the same) and say whether it can answer any of a server's questions."""
        declared = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
        if not declared:  # the common case, on every call: nothing to keep, nothing to validate
            self.declared.pop(owner, None)
            return False
        known = self.declared.get(owner)
        if known is not None and self._raw_declared.get(owner) == declared:
            return _answers(known)
        try:
            capabilities = types.ClientCapabilities.model_validate(declared)
        except ValueError:
            return False
        self._raw_declared[owner] = declared
        if len(self.declared) > 10_000:  # bounded: one entry per live agent is all it needs
            self.declared.clear()
            self._raw_declared.clear()
        self.declared[owner] = capabilities
        return _answers(capabilities)

    def capabilities_of(self, owner: Owner) -> dict | None:
        """What the agent behind `owner` can answer, as a stateless server is told it on each call."""
        session = self.sessions.get(owner)
        declared = session.client_params.capabilities if session is not None else self.declared.get(owner)
        if declared is None or not _answers(declared):
            return None
        return declared.model_dump(by_alias=True, mode="json", exclude_none=True, include={
            "elicitation", "sampling", "roots"})

    def can_ask(self, owner: Owner) -> bool:
        """Whether a server may ask the agent behind `owner` something, on either protocol."""
        return self.answers_requests(owner) or (owner in self.declared and _answers(self.declared[owner]))

    def answers_requests(self, owner: Owner) -> bool:
        """Whether the agent behind `owner` declared it can answer a server's requests."""
        session = self.sessions.get(owner)
        return session is not None and _answers(session.client_params.capabilities)

    def subscribed(self, owner: Owner, server: str, uri: str, as_named: str) -> None:
        self.subscriptions[(owner, server, uri)] = as_named

    def unsubscribed(self, owner: Owner, server: str, uri: str) -> None:
        self.subscriptions.pop((owner, server, uri), None)

    def subscribed_at(self, owner: Owner, server: str) -> list[str]:
        """The server's URIs of the resources `owner` subscribed to there."""
        return [uri for (whose, name, uri) in self.subscriptions if whose == owner and name == server]

    def forget(self, owner: Owner) -> None:
        self.sessions.pop(owner, None)
        for key in [key for key in self.subscriptions if key[0] == owner]:
            del self.subscriptions[key]
        self.buses.pop(owner, None)

    def on_handshake(self, owner: Owner) -> bool:
        """Whether the agent behind `owner` is on the initialize handshake: then its upstream sessions are
        too, whatever the server speaks, so nothing it could do directly is lost (a server's question in the
        middle of a call, its log messages in the call)."""
        return owner is not None and owner in self.sessions

    def client_options(self, owner: Owner, server: str) -> dict[str, Any]:
        """The SDK client's callbacks for `owner`'s session with `server`: a notification handler, and one
        for each kind of request the agent declared it can answer (so the server sees those capabilities);
        a handshake agent's session is on the handshake too (`on_handshake`)."""
        session = self.sessions.get(owner)
        if owner is None:
            return {}
        options: dict[str, Any] = {"message_handler": self.notifications(owner, server)}
        if session is not None:
            options["mode"] = "legacy"
        if session is None and owner not in self.declared:
            return options
        capabilities = session.client_params.capabilities if session is not None else self.declared[owner]
        options["declared"] = capabilities
        if capabilities.elicitation is not None:
            options["elicitation_callback"] = self._asking(
                owner, server, types.ElicitRequest, types.ElicitResult
            )
        if capabilities.sampling is not None:
            options["sampling_callback"] = self._asking(owner, server, types.CreateMessageRequest,
                                                        types.CreateMessageResult)
            options["sampling_capabilities"] = capabilities.sampling
        if capabilities.roots is not None:
            options["list_roots_callback"] = self._roots(owner, server)
        return options

    def notifications(self, owner: Owner, server: str):
        """The handler for what `server` sends `owner`'s session on its own (on its upstream session, or its
        listen stream to a stateless server)."""
        async def relay(message) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                named = self.subscriptions.get((owner, server, message.params.uri))
                if named is None:
                    return
                message = types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=named)
                )
            elif not isinstance(message, _RELAYED_NOTIFICATIONS):
                return  # progress is relayed on its call's token; transport failures are the client's own
            if isinstance(message, types.ToolListChangedNotification) and self.tools_changed is not None:
                # The catalogue is read again, so the agent's tools/list that follows is current; not here,
                # where the session's own reading waits for this handler (a request on it would never end).
                task = asyncio.ensure_future(self.tools_changed(owner, server))
                self._pending_reads.add(task)
                task.add_done_callback(self._pending_reads.discard)
            session = self.sessions.get(owner)
            if session is not None:
                await self._tell(owner, session, message)
            elif (
                owner in self.buses
            ):  # a 2026-07-28 agent hears on its listen streams (no log messages there)
                event = (
                    ResourceUpdated(uri=message.params.uri)
                    if isinstance(message, types.ResourceUpdatedNotification)
                    else _EVENTS.get(type(message), lambda: None)()
                )
                if event is not None:
                    await self.buses[owner][0].publish(event)

        return relay

    async def _tell(self, owner: Owner, session, message) -> None:
        """A notification for a handshake agent: on its GET stream, here or in the process that holds it."""
        session_id = owner[1] if isinstance(owner, tuple) else None
        if self.streams is not None and self.bus is not None and self.bus.url and session_id \
                and not self.streams.holds_stream(session_id):
            await self.bus.publish(
                "notify",
                {
                    "session": session_id,
                    "notification": message.model_dump(by_alias=True, mode="json", exclude_none=True),
                },
            )
            return
        with contextlib.suppress(Exception):  # an agent that went away misses it; nothing else does
            await session.send_notification(message)

    async def _heard(self, data: dict[str, Any]) -> None:
        """A notification another process heard for a session whose GET stream may be here."""
        if self.streams is not None and isinstance(data.get("notification"), dict):
            await self.streams.to_stream(str(data.get("session")), data["notification"])

    async def answer(self, owner: Owner, server: str, asked: Any) -> dict | None:
        """The agent's answer to one request a 2026-07-28 server embedded in an `input_required` result, put
        to the agent as the request itself; None when the agent cannot answer it (it did not declare that
        capability, or it refused or failed)."""
        method = asked.get("method") if isinstance(asked, dict) else None
        session = self.sessions.get(owner)
        if method not in ASKS or session is None:  # only a handshake agent is asked this way
            return None
        request_type, result_type, capability = ASKS[method]
        if getattr(session.client_params.capabilities, capability) is None:
            return None
        try:
            request = request_type.model_validate(asked)
        except ValueError:
            return None
        result = await self._ask(owner, server, request, result_type)
        if isinstance(result, types.ErrorData):
            return None
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    def _asking(self, owner: Owner, server: str, request_type, result_type):
        async def ask(context, params):
            return await self._ask(owner, server, request_type(params=params), result_type)

        return ask

    def _roots(self, owner: Owner, server: str):
        async def ask(context):
            return await self._ask(owner, server, types.ListRootsRequest(), types.ListRootsResult)

        return ask

    def _channel(self, owner: Owner) -> tuple["_Call | None", Any]:
        """The agent's call in flight, and the session a question goes on: its request's, or its handshake
        session's; None for a 2026-07-28 request, which has no channel back (it is asked by its answer)."""
        calls = self.calls.get(owner) or []
        call = calls[-1] if calls else None
        session = call.session if call is not None and call.session is not None else self.sessions.get(owner)
        if session is not None and session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            session = None
        return call, session

    async def _ask(self, owner: Owner, server: str, request, result_type):
        """Put the server's request to the agent, on the stream of its call in flight if it has one, and
        journal both the request and the agent's answer with that call's step."""
        call, session = self._channel(owner)
        by_answer = session is None and self.bridge is not None and self.bridge.asking(owner)
        if session is None and not by_answer:
            if call is not None:
                call.failed = "the agent's session had ended"
            return types.ErrorData(code=-32603, message="The agent's session has ended.")
        metadata = ServerMessageMetadata(related_request_id="call") if call is not None else None
        answer: Any
        try:
            if by_answer:  # a 2026-07-28 agent: asked by the answer to its call, answering by its retry
                got = await self.bridge.ask(
                    owner, request.model_dump(by_alias=True, mode="json", exclude_none=True)
                )
                if isinstance(got, types.ErrorData):
                    raise MCPError(code=got.code, message=got.message, data=got.data)
                result = result_type.model_validate(got)
            else:
                result = await session.send_request(request, result_type, metadata=metadata)
            answer = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        except MCPError as exc:
            result = exc.error
            answer = {"error": exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)}
        except Exception as exc:  # noqa: BLE001 - the agent could not be asked; the server is told so
            result = types.ErrorData(
                code=-32603, message=f"The agent could not be asked: {type(exc).__name__}"
            )
            if call is not None:
                call.failed = f"the agent could not be asked ({type(exc).__name__})"
            answer = {"error": result.model_dump(by_alias=True, mode="json", exclude_none=True)}
        if call is not None and call.step is not None:
            sent = request.model_dump(by_alias=True, mode="json", exclude_none=True)
            try:
                await self.journal.run(
                    services.record_event,
                    run_id=call.step.run_id,
                    event="relayed",
                    now=timezone.now(),
                    data={
                        "step": call.step.number,
                        "server": server,
                        "method": sent["method"],
                        "params": sent.get("params"),
                        "answer": answer,
                    },
                )
            except Exception:  # the agent answered: a journal failure must not turn it into an error
                logger.exception(
                    "could not journal a %s relayed for step %s", sent["method"], call.step.number
                )
        return result
