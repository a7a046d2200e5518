"""A real MCP client talking to the Recorder, as an agent would."""

import contextlib
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services


def register_samples(samples, names=("crm", "calendar", "mail", "payments", "inventory", "legacy")):
    return {name: services.refresh_catalogue(server=services.register_tool_server(name=name, url=samples.url(name)))
            for name in names}


@contextlib.asynccontextmanager
async def agent_client(recorder, token: str, *, mode: str = "auto"):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(f"{recorder.base}/mcp/", http_client=http), mode=mode,
                          cache=None) as client:
            yield client


def run_agent(recorder, token: str, script, *, mode: str = "auto") -> Any:
    """Run `script(client)` in a fresh event loop and return what it returns."""

    async def main():
        async with agent_client(recorder, token, mode=mode) as client:
            return await script(client)

    return anyio.run(main)
