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


def settle(recorder) -> None:
    """Wait until the Recorder served by `recorder` (a ServerThread) has run every queued journal write."""
    recorder.app.recorder.journal.settle()
