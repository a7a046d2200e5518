"""What tool servers on the stateless 2026-07-28 protocol have to say, heard for each agent session.

Such a server keeps nothing per session, so one connection serves every agent (`client.Upstreams`), and it
says nothing on its own: list changes and updates of resources come only on the `subscriptions/listen`
streams its clients open. The Recorder opens one for each agent session that would hear them directly, with
that session's filters, and relays what arrives exactly as if it had come on the session's own upstream
session (`relay.Relay.notifications`: renamed to the agent's URIs, the catalogue read again):

- a 2026-07-28 agent's own listen stream: an upstream stream to each such server for as long as the
  agent's lasts, asking for what the agent asked (`for_stream`);
- an agent on the handshake, which has a stream back: one upstream stream per server once the session lists
  or subscribes to anything, asking for every list change and the resources the session subscribed to
  there; it is opened again when those change, and closed with the session (`keep`, `forget`).

A stream that breaks is opened again after RETRY_SECONDS; a server that has no `subscriptions/listen` is
left alone.
"""

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import anyio
from mcp import MCPError
from mcp.shared.subscriptions import event_to_notification

from ..models import ToolServer
from ..upstream.client import Owner, ToolServerError, Upstreams, endpoint_of

logger = logging.getLogger(__name__)

RETRY_SECONDS = 2.0
SWEEP_SECONDS = 30.0  # how often streams of handshake sessions that ended without a DELETE are closed
METHOD_NOT_FOUND = -32601
READY_SECONDS = 5.0  # how long an agent's listen (or subscribe) waits for the upstream streams to listen


class Listening:
    def __init__(self, upstreams: Upstreams, relay):
        self.upstreams, self.relay = upstreams, relay
        # A handshake session's stream to one server: (owner, server name) -> (the URIs it asks for, its
        # scope)
        self._kept: dict[tuple[Owner, str], tuple[frozenset[str], anyio.CancelScope]] = {}
        self._group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> "Listening":
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._sweep)
        return self

    async def __aexit__(self, *exc_info) -> None:
        assert self._group is not None
        self._group.cancel_scope.cancel()
        with contextlib.suppress(Exception):
            await self._group.__aexit__(None, None, None)
        self._kept.clear()

    async def stateless(self, server: ToolServer):
        """The SDK client of the one shared connection to `server` if it is on the stateless protocol, else
        None (its notifications come on each session's own upstream session)."""
        endpoint = endpoint_of(server)
        if endpoint.transport != "http":
            return None
        try:
            return await self.upstreams.stateless_client(endpoint)
        except ToolServerError as exc:
            logger.info("not listening to %s: %s", server.name, exc.message)
            return None

    @contextlib.asynccontextmanager
    async def for_stream(self, owner: Owner, servers: Iterable[ToolServer], *, tools: bool, prompts: bool,
                         resources: bool, uris: dict[str, set[str]]):
        """While the block runs (a 2026 agent's listen stream is open), what each stateless server has to
        say about what the agent asked for reaches it. `uris` is, by server, the server's own URIs of the
        resources the agent named."""
        async def hear(server: ToolServer, ready: anyio.Event) -> None:
            client = await self.stateless(server)
            if client is None:
                ready.set()
                return
            await self._pump(owner, server.name, client, tools=tools, prompts=prompts, resources=resources,
                             uris=uris.get(server.name, set()), ready=ready)

        async with anyio.create_task_group() as group:
            waits = []
            for server in servers:
                waits.append(ready := anyio.Event())
                group.start_soon(hear, server, ready)
            await _ready(waits)  # so what happens once the agent's stream is acknowledged reaches it
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    def keep(self, owner: Owner, servers: Iterable[ToolServer]) -> list[anyio.Event]:
        """A handshake session hears every server it uses: a stream to each stateless one, asking for the
        resources it subscribed to there (opened again when those changed). Returns, for each stream opened
        now, an event set once it is listening (or has found it cannot)."""
        opened: list[anyio.Event] = []
        if owner is None or self._group is None or self.relay.sessions.get(owner) is None:
            return opened
        for server in servers:
            uris = frozenset(self.relay.subscribed_at(owner, server.name))
            kept = self._kept.get((owner, server.name))
            if kept is not None and kept[0] == uris:
                continue
            if kept is not None:
                kept[1].cancel()
            scope = anyio.CancelScope()
            self._kept[(owner, server.name)] = (uris, scope)
            opened.append(ready := anyio.Event())
            self._group.start_soon(self._keep_one, owner, server, uris, scope, ready)
        return opened

    async def kept(self, owner: Owner, servers: Iterable[ToolServer]) -> None:
        """`keep`, waiting (a little) until the streams it opened listen."""
        await _ready(self.keep(owner, servers))

    async def _keep_one(
        self,
        owner: Owner,
        server: ToolServer,
        uris: frozenset[str],
        scope: anyio.CancelScope,
        ready: anyio.Event,
    ) -> None:
        with scope:
            client = await self.stateless(server)
            if client is None:
                ready.set()
                return
            await self._pump(owner, server.name, client, tools=True, prompts=True, resources=True, uris=uris,
                             ready=ready)

    def forget(self, owner: Owner) -> None:
        """The session ended: its streams close."""
        for key in [key for key in self._kept if key[0] == owner]:
            self._kept.pop(key)[1].cancel()

    async def _sweep(self) -> None:
        while True:
            await anyio.sleep(SWEEP_SECONDS)
            for owner in {owner for owner, _ in self._kept if self.relay.sessions.get(owner) is None}:
                self.forget(owner)

    async def _pump(
        self,
        owner: Owner,
        server_name: str,
        client,
        *,
        tools: bool,
        prompts: bool,
        resources: bool,
        uris: Any,
        ready: anyio.Event,
    ) -> None:
        """Relay what one upstream listen stream carries, opening it again when it breaks; `ready` is set once
        it is acknowledged, or found impossible."""
        try:
            if not (tools or prompts or resources or uris):
                return
            relay = self.relay.notifications(owner, server_name)
            while True:
                try:
                    async with client.listen(tools_list_changed=tools, prompts_list_changed=prompts,
                                             resources_list_changed=resources,
                                             resource_subscriptions=sorted(uris)) as subscription:
                        ready.set()
                        async for event in subscription:
                            await relay(event_to_notification(event, {}))
                except MCPError as exc:
                    if exc.error.code == METHOD_NOT_FOUND:
                        return
                    logger.info("%s refused a listen stream: %s", server_name, exc.error.message)
                except Exception as exc:  # noqa: BLE001 - a broken stream is opened again
                    logger.info("the listen stream to %s broke: %s", server_name, type(exc).__name__)
                ready.set()
                await anyio.sleep(RETRY_SECONDS)
        finally:
            ready.set()


async def _ready(waits: list[anyio.Event]) -> None:
    with anyio.move_on_after(READY_SECONDS):
        for ready in waits:
            await ready.wait()
