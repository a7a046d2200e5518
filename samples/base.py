"""What every sample server shares: persistent state with a ledger, an MCP endpoint, and a control door."""

import json
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

Handler = Callable[[dict[str, Any]], Awaitable[types.CallToolResult]]


def now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Store:
    """A JSON document on disk, rewritten atomically after every change, so a restarted server (or a second
    demo start) remembers its records, tokens and ledger."""

    def __init__(self, path: Path | None, initial: dict[str, Any]):
        self.path = path
        self.lock = anyio.Lock()
        if path is not None and path.exists():
            self.data = json.loads(path.read_text())
        else:
            self.data = initial
            self.data.setdefault("ledger", [])
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def record(self, entry: dict[str, Any]) -> None:
        self.data["ledger"].append({"at": rfc3339(now()), **entry})


def text_result(text: str, *, structured: Any = None, meta: dict | None = None, is_error: bool = False):
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=is_error,
        _meta=meta,
    )


def tool_error(text: str, *, code: str | None = None, **structured: Any) -> types.CallToolResult:
    return text_result(text, structured={"code": code, **structured} if code else None, is_error=True)


class SampleServer:
    """A name, some tools (raw dicts, exactly as listed) and their handlers."""

    name: str = ""

    def __init__(self, state_dir: Path | None):
        self.store = Store(state_dir / f"{self.name}.json" if state_dir else None, self.initial_state())
        self.delay_ms = 0  # before the call is handled
        self.answer_delay_ms = 0  # after the call has acted, before it answers (the fault tests' window)
        # normal | rpc_error | input_required | error_5xx | garbage | hang | lie | act_then_hang
        # (samples.app.Faults)
        self.mode = "normal"

    def initial_state(self) -> dict[str, Any]:
        return {"ledger": []}

    def tools(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def handlers(self) -> dict[str, Handler]:
        raise NotImplementedError

    def colleague_routes(self) -> list[Route]:
        return []

    async def list_tools(self, ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool.model_validate(tool) for tool in self.tools()])

    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        if self.delay_ms:
            try:
                await anyio.sleep(self.delay_ms / 1000)
            except anyio.get_cancelled_exc_class():
                # The client cancelled while the call was in hand: the ledger says so (tests read it).
                self.store.record({"op": "cancelled", "tool": params.name})
                raise
        if self.mode == "rpc_error":
            raise MCPError(code=-32602, message=f"Invalid params for {params.name}",
                           data={"field": "arguments", "tool": params.name})
        if self.mode == "input_required":  # 2026-07-28: ask the client for more before answering
            return types.InputRequiredResult(
                result_type="input_required", request_state=f"ask-again:{params.name}"
            )
        if self.mode == "ask_name" and (ctx.session.client_capabilities is None
                                        or ctx.session.client_capabilities.elicitation is None):
            return tool_error(
                "This tool asks who is calling: it needs a client that can answer (elicitation)."
            )
        if self.mode == "ask_name":  # 2026-07-28: ask the user (an elicitation) before answering
            answer = (params.input_responses or {}).get("name")
            if isinstance(answer, types.ElicitResult) and params.request_state == "asked:name":
                if answer.action != "accept" or not answer.content:
                    return tool_error("No name given.")
                self.store.record({"op": "greeted", "name": answer.content.get("name")})
                return text_result(f"Hello {answer.content.get('name')}")
            return types.InputRequiredResult(
                result_type="input_required",
                request_state="asked:name",
                input_requests={
                    "name": types.ElicitRequest(
                        params=types.ElicitRequestFormParams(
                            message="Who is asking?",
                            requested_schema={
                                "type": "object",
                                "properties": {"name": {"type": "string"}},
                                "required": ["name"],
                            },
                        )
                    )
                },
            )
        handler = self.handlers().get(params.name)
        if handler is None:
            return tool_error(f"Unknown tool {params.name!r}", code="NOT_FOUND")
        arguments = dict(params.arguments or {})
        if params.meta and isinstance(params.meta, dict):
            arguments["__meta"] = params.meta.get("hatp/journal") or {}
        try:
            async with self.store.lock:
                result = await handler(arguments)
        except (KeyError, TypeError, ValueError) as exc:
            return tool_error(f"Invalid arguments: {exc}", code="INVALID_ARGUMENTS")
        if self.answer_delay_ms:  # the change is made and kept; only the answer waits
            await anyio.sleep(self.answer_delay_ms / 1000)
        return result

    def once(self, key: str | None, action: Callable[[], types.CallToolResult]) -> types.CallToolResult:
        """Run `action` at most once per idempotency key: a replayed key returns the first outcome and
        changes nothing (docs/design.md). Without a key the action simply runs."""
        remembered = self.store.data.setdefault("idempotency", {})
        if key and key in remembered:
            return types.CallToolResult.model_validate(remembered[key])
        result = action()
        if key:
            remembered[key] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        self.store.save()
        return result

    def mcp_server(self) -> Server:
        return Server(self.name, version="1.0", on_list_tools=self.list_tools, on_call_tool=self.call_tool)

    async def ledger(self, request: Request) -> JSONResponse:
        return JSONResponse({"server": self.name, "ledger": self.store.data["ledger"]})

    async def control(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.delay_ms = int(body.get("delay_ms", self.delay_ms))
        self.answer_delay_ms = int(body.get("answer_delay_ms", self.answer_delay_ms))
        self.mode = str(body.get("mode", self.mode))
        return JSONResponse({"delay_ms": self.delay_ms, "answer_delay_ms": self.answer_delay_ms,
                             "mode": self.mode})


def local_transport_security() -> TransportSecuritySettings:
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )
