"""A client that expects a server's own names (the MCP conformance suite calls `test_simple_text` and reads
`test://static-text`) talking to the Recorder, which names them `server__test_simple_text` and
`recorder://server/test://static-text`: this proxy puts the Recorder's names on what the client sends and
takes them off what comes back (event streams event by event, as they come), and adds the agent's bearer
token. Nothing else changes, headers included (Host and Origin reach the Recorder as the client sent them)."""

import json
from typing import Any

import httpx2 as httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

_HOP = {"host", "content-length", "connection", "transfer-encoding", "authorization"}


class NameMapping:
    """The ASGI app: every request to it goes to `target` (the Recorder's /mcp/) as agent `token`, for the
    tool server registered as `server`."""

    def __init__(self, target: str, token: str, server: str):
        self.target, self.token, self.server = target, token, server
        self.tool_prefix, self.uri_prefix = f"{server}__", f"recorder://{server}/"

    def to_recorder(self, message: Any) -> Any:
        if isinstance(message, list):
            return [self.to_recorder(item) for item in message]
        params = message.get("params") if isinstance(message, dict) else None
        if not isinstance(params, dict):
            return message
        method = message.get("method")
        if method in ("tools/call", "prompts/get") and isinstance(params.get("name"), str):
            params["name"] = self.tool_prefix + params["name"]
        if method in ("resources/read", "resources/subscribe", "resources/unsubscribe") \
                and isinstance(params.get("uri"), str):
            params["uri"] = self.uri_prefix + params["uri"]
        ref = params.get("ref") if method == "completion/complete" else None
        if isinstance(ref, dict) and isinstance(ref.get("name"), str):
            ref["name"] = self.tool_prefix + ref["name"]
        if isinstance(ref, dict) and isinstance(ref.get("uri"), str):
            ref["uri"] = self.uri_prefix + ref["uri"]
        return message

    def from_recorder(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self.from_recorder(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.from_recorder(item, key) for item in value]
        if isinstance(value, str):
            if value.startswith(self.uri_prefix):
                return value.removeprefix(self.uri_prefix)
            if key == "name" and value.startswith(self.tool_prefix):
                return value.removeprefix(self.tool_prefix)
        return value

    def _event_line(self, line: str) -> str:
        if not line.startswith("data:"):
            return line
        try:
            return "data: " + json.dumps(self.from_recorder(json.loads(line[5:])))
        except ValueError:
            return line

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        body = await request.body()
        if body:
            try:
                body = json.dumps(self.to_recorder(json.loads(body))).encode()
            except ValueError:
                pass
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["host"] = request.headers.get("host", "")
        headers["authorization"] = f"Bearer {self.token}"
        client = httpx.AsyncClient(timeout=None)
        upstream = await client.send(client.build_request(request.method, self.target, headers=headers,
                                                          content=body), stream=True)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            async def events():
                try:
                    async for line in upstream.aiter_lines():
                        yield (self._event_line(line) + "\n").encode()
                finally:
                    await upstream.aclose()
                    await client.aclose()

            response = StreamingResponse(events(), status_code=upstream.status_code, headers=kept)
        else:
            raw = await upstream.aread()
            await upstream.aclose()
            await client.aclose()
            try:
                raw = json.dumps(self.from_recorder(json.loads(raw))).encode() if raw else raw
            except ValueError:
                pass
            response = Response(raw, status_code=upstream.status_code, headers=kept)
        await response(scope, receive, send)
