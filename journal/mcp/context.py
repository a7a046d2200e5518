"""What every handler of the Recorder's reads from a request, and the errors it answers with."""

import hashlib
import json
import uuid
from typing import Any

import mcp_types as types
from mcp import MCPError

from ..models import Agent, ToolServer
from ..models.servers import SEPARATOR as SEPARATOR  # tools and prompts are named server__name
from ..record import idempotency, journaling
from ..record.canonical import canonical_bytes, ijson_problem
from ..services.runs import IDLE_KEY
from ..undo import declarations, recovery
from ..upstream.client import ToolServerError
from . import versions

RUN_ID_KEY = "runId"
# The same runId as an HTTP header, for frameworks that send no `_meta` of the agent's but let it set a
# client's headers (the Vercel AI SDK, LlamaIndex, AutoGen): one client per task, one run per client.
RUN_ID_HEADER = "hatp-run-id"
# A listed resource's URI is the server's own, carried by a URI of the Recorder's (RFC 3986, so every client
# takes it as a URI): recorder://server/demo://resource/1. Templates likewise, so what an agent builds from
# one routes too.
RESOURCE_SCHEME = "recorder://"


def resource_uri(server: str, uri: str) -> str:
    """A server's resource URI (or URI template) as the Recorder lists it."""
    return f"{RESOURCE_SCHEME}{server}/{uri}"


def resource_of(uri: str) -> tuple[str, str] | None:
    """The server and its own URI, from a URI the Recorder listed (or from the older `server__uri` form,
    which agents may have kept); None for any other URI."""
    if uri[:len(RESOURCE_SCHEME)].lower() == RESOURCE_SCHEME:
        name, slash, original = uri[len(RESOURCE_SCHEME):].partition("/")
        return (name, original) if slash and name and original else None
    name, separator, original = uri.partition(SEPARATOR)
    return (name, original) if separator and name and original else None


def enabled_servers() -> list[ToolServer]:
    return list(ToolServer.objects.filter(enabled=True))


def agent_of(ctx) -> Agent:
    request = ctx.request
    agent = request.scope.get("state", {}).get("agent") if request is not None else None
    if agent is None:  # BearerAgent guards the route, so this is a wiring bug, not a client error
        raise recorder_error(-32603, "No authenticated agent on this request", reason="internal")
    return agent


def run_header_of(ctx) -> str | None:
    """The runId the agent's request sends as a header (`RUN_ID_HEADER`), if any."""
    return ctx.request.headers.get(RUN_ID_HEADER) if ctx.request is not None else None


def session_of(ctx) -> str | None:
    """The agent's MCP session id (none on the stateless 2026-07-28 protocol)."""
    return ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None


def owner_of(agent: Agent, session_id: str | None, meta: Any = None) -> tuple[int, str]:
    """Whose upstream sessions a call uses: the agent's MCP session's, so nothing a tool server keeps per
    session is shared between two agents or two sessions of one agent. A stateless 2026-07-28 request has no
    session: its client is known by what each of its requests declares (`clientInfo` and
    `clientCapabilities` in `_meta`), so two client programs of one agent, or one that can answer a server's
    questions and one that cannot, never share an upstream session (two runs of the same program do)."""
    if session_id:
        return (agent.pk, session_id)
    declared = {key: meta[key] for key in (types.CLIENT_INFO_META_KEY, types.CLIENT_CAPABILITIES_META_KEY)
                if key in meta} if isinstance(meta, dict) else {}
    if not declared:
        return (agent.pk, "")
    text = json.dumps(declared, sort_keys=True, default=str, ensure_ascii=True)
    return (agent.pk, "client:" + hashlib.sha256(text.encode()).hexdigest()[:32])


# The agent's progress token, as the wire names it and as the SDK's request context does.
_PROGRESS_TOKEN_KEYS = ("progressToken", "progress_token")


def progress_token(meta: Any) -> Any:
    """The progress token the agent's request carries, if any."""
    if not isinstance(meta, dict):
        return None
    return next((meta[key] for key in _PROGRESS_TOKEN_KEYS if meta.get(key) is not None), None)


def forwarded_meta(meta: Any) -> dict[str, Any] | None:
    """The agent's `_meta`, minus the protocol envelope each hop writes for itself and the agent's progress
    token (the Recorder asks each server for progress on a token of its own, and relays it on the agent's)."""
    kept = versions.without_envelope(meta) or {}
    return {k: v for k, v in kept.items() if k not in _PROGRESS_TOKEN_KEYS} or None


# The keys of `_meta["hatp/journal"]` that are the Recorder's own on a held call: which run it joins is
# decided before it is held, and its idempotency key is the approval's (`held_call_meta`).
_RECORDER_KEYS = (RUN_ID_KEY, idempotency.KEY)


def held_call_meta(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """What of an agent's `_meta` goes out with a held call, and is covered by its approval: all of it but
    the Recorder's own `hatp/journal` keys."""
    if not meta:
        return None
    journal = meta.get(declarations.HATP_KEY)
    if not isinstance(journal, dict):
        return meta
    kept = {k: v for k, v in journal.items() if k not in _RECORDER_KEYS}
    rest = {k: v for k, v in meta.items() if k != declarations.HATP_KEY}
    return ({**rest, declarations.HATP_KEY: kept} if kept else rest) or None


def approved_meta(meta: dict[str, Any] | None, approval: str) -> dict[str, Any]:
    """A held call's `_meta` as it is sent once approved: as approved, with the approval's own idempotency
    key, so a server that honours one never acts twice on one approval."""
    meta = dict(meta or {})
    journal = meta.get(declarations.HATP_KEY)
    meta[declarations.HATP_KEY] = {
        **(journal if isinstance(journal, dict) else {}),
        idempotency.KEY: approval,
    }
    return meta


def unsendable(arguments: dict[str, Any], meta: dict[str, Any] | None, server: str) -> str | None:
    """Why a call is not sent, if its arguments or `_meta` are not I-JSON. What is journaled, signed and
    approved is canonical JSON: a call that would not survive it unchanged is refused, so a server always
    receives exactly what the record says (and an approver signed)."""
    for part, value in (("arguments", arguments), ("_meta", meta)):
        if (problem := ijson_problem(value)) is not None:
            what = "cannot be kept exactly" if "U+0000" in problem else "are not I-JSON (RFC 7493)"
            return f"Not sent: the call's {part} {what} {problem}. Nothing was journaled or sent to {server}."
    if meta and (size := len(canonical_bytes(meta))) > META_LIMIT:
        return (f"Not sent: the call's _meta is {size} bytes, over the {META_LIMIT} the Recorder journals "
                f"with a call. Nothing was journaled or sent to {server}.")
    journal = (meta or {}).get(declarations.HATP_KEY)
    name = journal.get(RUN_NAME) if isinstance(journal, dict) else None
    if name is not None and (not isinstance(name, str) or len(name) > RUN_NAME_LIMIT):
        return (f"Not sent: _meta[\"hatp/journal\"][\"runName\"] names the run in the run list: a text of at "
                f"most {RUN_NAME_LIMIT} characters. Nothing was journaled or sent to {server}.")
    return None


# What of `_meta` is journaled with a call at most (the agent's progress token aside), and how long the name
# an agent gives its run may be: a 3 MB name was read back on every page of the run list.
META_LIMIT = 64 * 1024
RUN_NAME, RUN_NAME_LIMIT = "runName", 200


# The failure behind each of the Recorder's own JSON-RPC errors, for the advice they carry.
_FAILURE_OF_REASON = {
    "internal": recovery.Failure("unknown"),
    "unavailable": recovery.Failure("transient"),
    "upstream_failed": recovery.Failure("transient"),
    "too_large": recovery.Failure("unknown", answered=True),
    "undelivered": recovery.Failure("unknown", may_have_acted=True, answered=True),
    "cancelled": recovery.Failure("unknown", may_have_acted=True),
    "too_deep": recovery.Failure("invalid_arguments"),
    "unknown_resource": recovery.Failure("not_found"),
    "unknown_prompt": recovery.Failure("not_found"),
}


def recorder_data(reason: str, advice: recovery.Advice | None = None, **more: Any) -> dict[str, Any]:
    """The `data` of a JSON-RPC error of the Recorder's own: it says so (an upstream's error, relayed exactly
    as the server sent it, never does), why, and what the agent should do
    (`_meta["hatp/journal"]["recovery"]`)."""
    advice = advice or recovery.advise(_FAILURE_OF_REASON.get(reason, recovery.Failure("unknown")))
    return {"source": "recorder", "reason": reason, **more,
            "_meta": {declarations.HATP_KEY: {"recovery": advice.as_wire()}}}


def recorder_error(
    code: int, message: str, *, reason: str, advice: recovery.Advice | None = None
) -> MCPError:
    """A JSON-RPC error of the Recorder's own (see `recorder_data`)."""
    return MCPError(code=code, message=message, data=recorder_data(reason, advice))


def upstream_error(exc: ToolServerError) -> MCPError:
    """The server's JSON-RPC error as it sent it: code, message and data, nothing added."""
    rpc = exc.rpc or {"code": exc.code, "message": exc.message}
    return MCPError(code=rpc["code"], message=rpc.get("message", ""), data=rpc.get("data"))


def client_program(meta: Any, session=None) -> str:
    """The client program a call comes from, as it names itself ("openai-agents 0.24.0"): on the handshake,
    from its session's initialize; on the stateless protocol, from the request's `_meta`; "" when unnamed."""
    info = None
    if session is not None and getattr(session, "client_params", None) is not None:
        info = session.client_params.client_info.model_dump()
    elif isinstance(meta, dict):
        info = meta.get(types.CLIENT_INFO_META_KEY)
    if not isinstance(info, dict):
        return ""
    return " ".join(str(info[key])[:60] for key in ("name", "version") if info.get(key))[:121]


def run_key(meta: Any, session_id: str | None, runs_by: str = "session", header: str | None = None) -> str:
    """Which run a call joins: the agent's runId (in the call's `_meta`, else in the request's `Hatp-Run-Id`
    header), else its MCP session (unless an admin said the agent's runs go by the idle gap alone, or by its
    runId only, `Agent.runs_by`), else none (the idle rule). For an agent whose runs go by its runId only, a
    call without one is a run of its own."""
    run_id = journaling.agent_journal(meta).get(RUN_ID_KEY)
    for named in (run_id, header):
        if isinstance(named, str) and named.strip():
            return "run:" + named.strip()[:190]
    if runs_by == "run_id":
        return "call:" + uuid.uuid4().hex
    if session_id and runs_by == "session":
        return "session:" + session_id[:180]
    # By the idle rule, but never across client programs: a stateless client names itself on every request
    # (two programs of one agent are two runs; two processes of one program still need a runId).
    program = meta.get(types.CLIENT_INFO_META_KEY) if isinstance(meta, dict) and not session_id else None
    if isinstance(program, dict) and (program.get("name") or program.get("version")):
        named = json.dumps([str(program.get("name")), str(program.get("version"))], ensure_ascii=True)
        return IDLE_KEY + hashlib.sha256(named.encode()).hexdigest()[:32]
    return ""
