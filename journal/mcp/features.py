"""The rest of MCP through the Recorder: resources, resource templates, prompts, completion and logging,
forwarded to each tool server on the agent's own upstream session and namespaced the way tools are.

Names: a prompt is `server__name`; a listed resource's URI is `recorder://server/uri` and a template's
`recorder://server/template` (valid URIs to every client, `context.resource_uri`), so a URI the agent builds
from a template routes too (and so does the older `server__uri`). A URI the agent got without the
prefix (a resource link or an embedded resource in a tool's result, a prompt's messages or a read's
contents) is read from the server that gave it to this agent session. Whatever the agent sends, the server
gets its own name or URI back, and its answers come back as it sent them.

A read is journaled as a step (`resources/read`, read-only), so what the agent saw is in the run's record.
A list asks every enabled server at once; a server that does not offer the feature, or fails, is left out
of the list (and logged), never the whole list failed for it.
"""

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from asgiref.sync import sync_to_async
from django.utils import timezone
from mcp import MCPError
from pydantic import ValidationError

from .. import services
from ..models import ToolServer
from ..upstream.client import Owner, ToolServerError, Upstreams, endpoint_of
from . import versions
from .context import (
    SEPARATOR,
    agent_of,
    enabled_servers,
    forwarded_meta,
    owner_of,
    recorder_data,
    recorder_error,
    resource_of,
    resource_uri,
    run_header_of,
    run_key,
    session_of,
    upstream_error,
)
from .journal_thread import JournalThread
from .listening import Listening
from .relay import Relay

logger = logging.getLogger(__name__)

RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for a resource nobody has
_GIVEN_PER_OWNER = 1000
_OWNERS = 1024


def uris_in(result: Any) -> Iterator[str]:
    """The resource URIs an answer hands the agent: resource links and embedded resources in a tool
    result's content or a prompt's messages, and a read's contents."""
    if not isinstance(result, dict):
        return
    blocks = list(result.get("content") or []) if isinstance(result.get("content"), list) else []
    for message in result.get("messages") or [] if isinstance(result.get("messages"), list) else []:
        if isinstance(message, dict):
            blocks.append(message.get("content"))
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "resource_link" and isinstance(block.get("uri"), str):
            yield block["uri"]
        elif block.get("type") == "resource" and isinstance(block.get("resource"), dict) \
                and isinstance(block["resource"].get("uri"), str):
            yield block["resource"]["uri"]
    for content in result.get("contents") or [] if isinstance(result.get("contents"), list) else []:
        if isinstance(content, dict) and isinstance(content.get("uri"), str):
            yield content["uri"]


@dataclass(frozen=True)
class _Listed:
    """A server's name, the prefix of its tools' names, and the tools it lists to one agent session (as
    `gateway.agent_tools` reads them)."""

    name: str
    prefix: str
    catalogue: list[dict]


def _valid(model, item: dict) -> bool:
    try:
        model.model_validate(item)
    except ValidationError:
        return False
    return True


class Features:
    """Handlers for everything but tools, for the Recorder's SDK server."""

    def __init__(self, *, journal: JournalThread, upstreams: Upstreams, relay: Relay, listening: Listening,
                 journal_outcome):
        self.journal, self.upstreams, self.relay, self.listening = journal, upstreams, relay, listening
        self.journal_outcome = journal_outcome  # (opened, started, outcome) -> awaitable: the Recorder's own
        # Which server gave an agent session each URI it holds without a prefix (bounded, oldest out).
        self.given: OrderedDict[Owner, OrderedDict[str, str]] = OrderedDict()

    def remember(self, owner: Owner, server_name: str, result: Any) -> None:
        uris = list(uris_in(result))
        if not uris:
            return
        given = self.given.pop(owner, None) or OrderedDict()
        self.given[owner] = given
        for uri in uris:
            given.pop(uri, None)
            given[uri] = server_name
        while len(given) > _GIVEN_PER_OWNER:
            given.popitem(last=False)
        while len(self.given) > _OWNERS:
            self.given.popitem(last=False)

    def route(self, owner: Owner, uri: str, servers: dict[str, ToolServer]) -> tuple[ToolServer, str]:
        """The server a URI belongs to, and the URI as that server named it."""
        named = resource_of(uri)
        if named is not None and named[0] in servers:
            return servers[named[0]], named[1]
        giver = (self.given.get(owner) or {}).get(uri)
        if giver in servers:
            return servers[giver], uri
        raise MCPError(
            code=RESOURCE_NOT_FOUND,
            message=(
                f"Resource not found: {uri!r} is not a URI any tool server gave this session. Listed "
                f"resources are named {resource_uri('server', 'uri')}."
            ),
            data=recorder_data("unknown_resource", uri=uri),
        )

    def _who(self, ctx) -> tuple[Any, Owner, str | None]:
        agent = agent_of(ctx)
        session_id = session_of(ctx)
        owner = owner_of(agent, session_id, ctx.meta)
        self.relay.heard_from(owner, ctx.session)
        return agent, owner, session_id

    async def _servers(self) -> dict[str, ToolServer]:
        return {server.name: server for server in await sync_to_async(enabled_servers)()}

    @staticmethod
    async def _each(servers, ask, failing: str) -> dict[str, Any]:
        """`ask(server)` of every server at once: what each answered, by name; a server that fails is left out
        (and logged, as `failing`), never the whole answer failed for it."""
        answers: dict[str, Any] = {}

        async def one(server: ToolServer) -> None:
            try:
                answers[server.name] = await ask(server)
            except ToolServerError as exc:
                logger.info("%s %s: %s", server.name, failing, exc.message)

        async with anyio.create_task_group() as group:
            for server in servers:
                group.start_soon(one, server)
        return answers

    async def _gather(self, ctx, request_type, key: str) -> list[tuple[str, dict]]:
        _, owner, _ = self._who(ctx)
        servers = list((await self._servers()).values())
        self.listening.keep(owner, servers)
        found = await self._each(servers, lambda server: self.upstreams.list_all(
            endpoint_of(server), request_type, key, owner=owner), f"is left out of {key}")
        return [(server.name, item) for server in servers for item in found.get(server.name, [])]

    async def live_catalogues(self, owner: Owner, servers: list[ToolServer]) -> list:
        """Each server with the tools it lists on `owner`'s session (its kept catalogue if that fails)."""
        live = await self._each(servers, lambda server: self.upstreams.list_tools(
            endpoint_of(server), owner=owner), "is listed with its kept tools: its live list failed")
        return [
            _Listed(server.name, server.prefix, live[server.name]) if server.name in live else server
            for server in servers
        ]

    @staticmethod
    def _for(ctx, result: dict) -> dict:
        return versions.for_client(result, version=ctx.session.protocol_version)

    async def list_resources(self, ctx, params) -> dict:
        items = await self._gather(ctx, types.ListResourcesRequest, "resources")
        return self._for(ctx, {"resources": [
            {**item, "uri": resource_uri(name, item["uri"])} for name, item in items
            if isinstance(item.get("uri"), str) and _valid(types.Resource, item)]})

    async def list_resource_templates(self, ctx, params) -> dict:
        items = await self._gather(ctx, types.ListResourceTemplatesRequest, "resourceTemplates")
        return self._for(ctx, {"resourceTemplates": [
            {**item, "uriTemplate": resource_uri(name, item["uriTemplate"])} for name, item in items
            if isinstance(item.get("uriTemplate"), str) and _valid(types.ResourceTemplate, item)]})

    async def list_prompts(self, ctx, params) -> dict:
        items = await self._gather(ctx, types.ListPromptsRequest, "prompts")
        return self._for(ctx, {"prompts": [
            {**item, "name": f"{name}{SEPARATOR}{item['name']}"} for name, item in items
            if isinstance(item.get("name"), str) and _valid(types.Prompt, item)]})

    async def _forward(self, server: ToolServer, owner: Owner, request) -> dict:
        """One request to `server` on `owner`'s session; its JSON-RPC error comes back verbatim, any other
        failure as the Recorder's own error."""
        try:
            return versions.from_server(
                await self.upstreams.request(endpoint_of(server), request, owner=owner)
            )
        except ToolServerError as exc:
            if exc.code is not None and not exc.transient and exc.oversized is None:
                raise upstream_error(exc) from None
            raise recorder_error(
                -32603, exc.message, reason="too_large" if exc.oversized else "upstream_failed"
            ) from None

    async def read_resource(self, ctx, params: types.ReadResourceRequestParams) -> dict:
        agent, owner, session_id = self._who(ctx)
        server, uri = self.route(owner, params.uri, await self._servers())
        meta = forwarded_meta(ctx.meta)
        started = timezone.now()
        opened = await self.journal.run(
            services.open_step, agent=agent,
            run_key=run_key(ctx.meta, session_id, agent.runs_by, run_header_of(ctx)),
            server=server, server_name=server.name, tool=services.READ["name"], arguments={"uri": uri},
            request_meta=meta, now=started, declared=services.READ)
        request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=uri, _meta=meta))
        try:
            result = await self._forward(server, owner, request)
        except MCPError as exc:
            await self.journal_outcome(opened, started, services.Outcome(
                error_message=exc.error.message, failure_class="unknown"))
            raise
        self.remember(owner, server.name, result)
        await self.journal_outcome(opened, started, services.Outcome(result=result))
        return self._for(ctx, result)

    async def get_prompt(self, ctx, params: types.GetPromptRequestParams) -> dict:
        _, owner, _ = self._who(ctx)
        servers = await self._servers()
        name, separator, prompt = params.name.partition(SEPARATOR)
        if not separator or name not in servers or not prompt:
            raise MCPError(code=-32602, message=f"Unknown prompt {params.name!r}: prompts are named "
                           f"server{SEPARATOR}prompt.", data=recorder_data("unknown_prompt"))
        result = await self._forward(
            servers[name],
            owner,
            types.GetPromptRequest(
                params=types.GetPromptRequestParams(
                    name=prompt, arguments=params.arguments, _meta=forwarded_meta(ctx.meta)
                )
            ),
        )
        self.remember(owner, name, result)
        return self._for(ctx, result)

    async def complete(self, ctx, params: types.CompleteRequestParams) -> dict:
        _, owner, _ = self._who(ctx)
        servers = await self._servers()
        sent = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        ref = dict(sent["ref"])
        if ref.get("type") == "ref/prompt":
            name, separator, prompt = str(ref.get("name", "")).partition(SEPARATOR)
            if not separator or name not in servers:
                raise MCPError(code=-32602, message=f"Unknown prompt {ref.get('name')!r}",
                               data=recorder_data("unknown_prompt"))
            server, ref["name"] = servers[name], prompt
        else:
            server, ref["uri"] = self.route(owner, str(ref.get("uri", "")), servers)
        sent["ref"] = ref
        sent.pop("_meta", None)
        request = types.CompleteRequest(params=types.CompleteRequestParams.model_validate(
            {**sent, **({"_meta": meta} if (meta := forwarded_meta(ctx.meta)) else {})}))
        return self._for(ctx, await self._forward(server, owner, request))

    async def subscribe(self, ctx, params: types.SubscribeRequestParams) -> dict:
        """An agent on the handshake subscribes: at the server, or, for a server on the stateless protocol
        (which has no `resources/subscribe`), on the session's listen stream to it (`listening.keep`)."""
        _, owner, _ = self._who(ctx)
        server, uri = self.route(owner, params.uri, await self._servers())
        if await self.listening.stateless(server) is None:
            await self._forward(
                server, owner, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
            )
        self.relay.subscribed(owner, server.name, uri, params.uri)
        await self.listening.kept(owner, [server])
        return {}

    async def unsubscribe(self, ctx, params: types.UnsubscribeRequestParams) -> dict:
        _, owner, _ = self._who(ctx)
        server, uri = self.route(owner, params.uri, await self._servers())
        if await self.listening.stateless(server) is None:
            await self._forward(
                server, owner, types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
            )
        self.relay.unsubscribed(owner, server.name, uri)
        self.listening.keep(owner, [server])
        return {}

    async def listen(self, ctx, params: types.SubscriptionsListenRequestParams):
        """A 2026-07-28 agent's `subscriptions/listen`: list changes and updates of the resources it names,
        from its own upstream sessions (each named resource is subscribed to at its server meanwhile) and
        from listen streams of its own to the servers on the stateless protocol (`listening`)."""
        _, owner, _ = self._who(ctx)
        servers = await self._servers()
        wanted = params.notifications
        listening = self.listening
        subscribed, streamed = [], {}
        for named in wanted.resource_subscriptions or []:
            try:
                server, uri = self.route(owner, named, servers)
                if await listening.stateless(server) is not None:
                    streamed.setdefault(server.name, set()).add(uri)
                else:
                    await self._forward(server, owner, types.SubscribeRequest(
                        params=types.SubscribeRequestParams(uri=uri)))
                    subscribed.append((server, uri))
            except MCPError as exc:
                logger.info("not subscribed to %s for a listen stream: %s", named, exc.error.message)
                continue
            self.relay.subscribed(owner, server.name, uri, named)
        try:
            async with listening.for_stream(owner, servers.values(), tools=bool(wanted.tools_list_changed),
                                            prompts=bool(wanted.prompts_list_changed),
                                            resources=bool(wanted.resources_list_changed), uris=streamed):
                return await self.relay.listener(owner)(ctx, params)
        finally:
            for name, uris in streamed.items():
                for uri in uris:
                    self.relay.unsubscribed(owner, name, uri)
            for server, uri in subscribed:
                self.relay.unsubscribed(owner, server.name, uri)
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await self._forward(server, owner, types.UnsubscribeRequest(
                        params=types.UnsubscribeRequestParams(uri=uri)))

    async def set_logging_level(self, ctx, params: types.SetLevelRequestParams) -> dict:
        """Every server this agent session uses logs at the agent's level (one without logging ignores it)."""
        _, owner, _ = self._who(ctx)
        level = types.SetLevelRequest(params=types.SetLevelRequestParams(level=params.level))
        await self._each((await self._servers()).values(), lambda server: self.upstreams.request(
            endpoint_of(server), level, owner=owner), "did not take the log level")
        return {}
