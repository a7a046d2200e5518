"""Who is calling: the agent behind `Authorization: Bearer …`, resolved once per HTTP request, from a
host this deployment answers for. The token is an agent's own `agt_…` token (headless agents), or an OAuth
access token a person authorised a client to use as one of their agents (`journal.services.clients`)."""

import json
import re
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from starlette.responses import JSONResponse

from .. import services
from ..models import Agent
from ..record import strict_json
from ..services import clients
from .context import recorder_data


class BearerAgent:
    """Authenticate the agent from `Authorization: Bearer …` before any MCP processing.

    A token's agent is remembered for AUTH_TTL seconds, so an agent's burst of calls costs one lookup;
    deactivating an agent (or its user) therefore takes effect within that many seconds. Refusals are
    never remembered, so a new agent works at once.
    """

    AUTH_TTL = 5.0

    def __init__(self, app, fast_calls=None, on_session_end=None):
        self.app = app
        self.fast_calls = fast_calls
        self.on_session_end = on_session_end  # (agent, session id), once an agent has ended its MCP session
        self._known: dict[str, tuple[Agent, float]] = {}

    async def _agent_for(self, token: str, scope) -> tuple[Agent | None, str]:
        if not token.startswith(services.TOKEN_PREFIX):
            # OAuth tokens are checked on every request, never remembered: revoking one takes effect at once.
            verdict = await sync_to_async(clients.agent_for_token)(token, audience=_recorder_url(scope))
            return verdict.agent, verdict.problem
        return await self._bearer_agent(token), "The token is not an active agent's."

    async def _bearer_agent(self, token: str) -> Agent | None:
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
        token = token.strip() if scheme.lower() == "bearer" else ""
        agent, problem = await self._agent_for(token, scope) if token else (None, "")
        if agent is None:
            return await _challenge(scope, problem)(scope, receive, send)
        scope.setdefault("state", {})["agent"] = agent
        if scope["method"] == "POST":
            receive, refusal = await _within_depth(receive)
            if refusal is not None:
                return await refusal(scope, receive, send)
        if self.fast_calls is not None and await self.fast_calls.handle(agent, scope, receive, send):
            return
        session_id = dict(scope.get("headers") or []).get(b"mcp-session-id")
        if scope["method"] != "DELETE" or not session_id or self.on_session_end is None:
            return await self.app(scope, receive, send)
        answered = []

        async def noted(message):
            if message["type"] == "http.response.start":
                answered.append(message["status"])
            await send(message)

        await self.app(scope, receive, noted)
        # Only the agent whose session it is ends it: another agent naming it was answered 404, and nothing
        # of the session (its upstream sessions, its record) may go because of that.
        if answered and answered[0] < 400:
            self.on_session_end(agent, session_id.decode("latin-1"))


_LEADING_ID = re.compile(rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(-?\d{1,15}|"[^"\\]{0,200}")')


async def _within_depth(receive):
    """Read the request's body (up to the SDK's own limit, which then refuses a longer one) and refuse JSON
    nested deeper than the Recorder keeps (`strict_json.MESSAGE_MAX_DEPTH`) before anything parses it: a
    parser recurses once per level. Returns the receive that replays the body, and a refusal or None."""
    chunks, size, more = [], 0, True
    while more and size <= DEFAULT_MAX_REQUEST_BODY_SIZE:
        message = await receive()
        if message["type"] != "http.request":
            chunks.append(message)
            break
        chunks.append(message)
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    replay = iter(chunks)

    async def replayed():
        return next(replay, None) or await receive()

    if size > DEFAULT_MAX_REQUEST_BODY_SIZE:
        return replayed, None
    body = b"".join(m.get("body", b"") for m in chunks if m["type"] == "http.request")
    depth = strict_json.deeper_than(body, strict_json.MESSAGE_MAX_DEPTH)
    if depth is None:
        return replayed, None
    found = _LEADING_ID.match(body[:300])
    request_id = json.loads(found.group(1)) if found else None
    error = {"code": -32600, "message": (
        f"The request nests {depth} levels deep; the Recorder reads at most {strict_json.MESSAGE_MAX_DEPTH} "
        f"(arguments and _meta at most {strict_json.MAX_DEPTH}). Nothing was journaled or sent."),
        "data": recorder_data("too_deep")}
    return replayed, JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error},
                                  status_code=200 if request_id is not None else 400)


def _recorder_url(scope) -> str:
    host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
    return clients.recorder_url(scope.get("scheme", "http"), host)


def _challenge(scope, problem: str) -> JSONResponse:
    """401 with an RFC 9728 challenge: a client that takes only a URL finds the authorization server from
    `resource_metadata`; one that sent a token learns why it was refused."""
    metadata = clients.resource_metadata_url(_recorder_url(scope))
    header = f'Bearer realm="recorder", resource_metadata="{metadata}", scope="{clients.SCOPE}"'
    if problem:
        header += ', error="invalid_token"'
    description = problem or (
        "Authenticate: send the agent's token as 'Authorization: Bearer agt_…', or sign in through the "
        f"authorization server named in {metadata}."
    )
    return JSONResponse({"error": "invalid_token", "error_description": description}, status_code=401,
                        headers={"WWW-Authenticate": header})


def transport_security() -> TransportSecuritySettings:
    """DNS-rebinding protection for the hosts in ALLOWED_HOSTS (none when it allows any host)."""
    hosts = [h for h in settings.ALLOWED_HOSTS if h and h != "*"]
    if "*" in settings.ALLOWED_HOSTS:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
        allowed_origins=[
            f"{scheme}://{h}{port}" for h in hosts for scheme in ("http", "https") for port in ("", ":*")
        ],
    )
