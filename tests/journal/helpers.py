"""A real MCP client talking to the Recorder, as an agent would."""

import contextlib
import json
import socket
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services


def register_samples(samples, names=("crm", "calendar", "mail", "payments", "inventory", "legacy")):
    return {
        name: services.refresh_catalogue(
            server=services.register_tool_server(name=name, url=samples.url(name))
        )
        for name in names
    }


@contextlib.asynccontextmanager
async def agent_client(recorder, token: str, *, mode: str = "auto", **options):
    """The `mcp` SDK's client, with `options` (its callbacks) as the agent's."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(f"{recorder.base}/mcp/", http_client=http), mode=mode,
                          cache=None, **options) as client:
            yield client


def run_agent(recorder, token: str, script, *, mode: str = "auto", **options) -> Any:
    """Run `script(client)` in a fresh event loop and return what it returns, once the Recorder has
    journaled everything the script did (it may answer a call before the outcome's commit)."""

    async def main():
        async with agent_client(recorder, token, mode=mode, **options) as client:
            return await script(client)

    try:
        return anyio.run(main)
    finally:
        settle(recorder)


def post_stateless_call(recorder, token: str, name: str, body: str, **headers: str) -> httpx2.Response:
    """A `tools/call` request body, sent exactly as written, on the stateless 2026-07-28 protocol (what no SDK
    would send: a malformed `_meta`, a big integer, a lone surrogate), with any more `headers`."""
    return httpx2.post(f"{recorder.base}/mcp/", content=body.encode(), timeout=30, headers={
        "authorization": f"Bearer {token}", "content-type": "application/json", "accept": "application/json",
        "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": name, **headers})


def settle(recorder) -> None:
    """Wait until the Recorder served by `recorder` (a ServerThread) has run every queued journal write."""
    recorder.app.recorder.journal.settle()


def without_advice(value: Any) -> Any:
    """`value` (a result, or results, as an agent got them through the Recorder) without the recovery advice
    the Recorder adds to every failed call (`_meta["hatp/journal"]["recovery"]`), for comparing with what the
    server sent. Every `isError` result must carry the advice, or this fails."""
    from journal.undo import recovery

    if isinstance(value, list):
        return [without_advice(item) for item in value]
    if not isinstance(value, dict):
        return value
    if value.get("isError") is not True:
        return value
    meta = dict(value.get("_meta") or {})
    journal = dict(meta.pop("hatp/journal", None) or {})
    advice = journal.pop("recovery", None)
    assert isinstance(advice, dict) and advice.get("action") in recovery.ACTIONS, (
        f"no recovery advice in {value}"
    )
    if journal:
        meta["hatp/journal"] = journal
    stripped = {key: item for key, item in value.items() if key != "_meta"}
    return {**stripped, "_meta": meta} if meta else stripped


def hang_up_after_sending(port: int, token: str, tool: str, arguments: dict) -> None:
    """A 2026 agent posts its `tools/call` to the Recorder on `port` and closes the connection at once."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
    head = (
        f"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
        f"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(head + body)
