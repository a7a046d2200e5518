"""The OpenAI Agents SDK's MCP client (tests/clients/openai-agents.txt) calling one tool through the Recorder
as an agent run does: `python openai_agents_probe.py URL TOKEN TOOL ARGUMENTS_JSON RUN_ID`, printing, as one
JSON line, what the agent's model would read of the tool's return and how long the call took.

The server is the SDK's `MCPServerStreamableHttp` with its defaults (a 5 s session timeout), and the tool is
invoked by the SDK's own `MCPUtil.invoke_mcp_tool`, with the run's id sent by `tool_meta_resolver` (how an
OpenAI agent names its run to the Recorder). No model provider is called."""

import asyncio
import json
import sys
import time

from agents import RunContextWrapper
from agents.mcp import MCPServerStreamableHttp, MCPUtil

URL, TOKEN, TOOL, ARGUMENTS, RUN_ID = sys.argv[1:6]


def run_id(context) -> dict:
    """The SDK's `tool_meta_resolver`: given the call's `MCPToolMetaContext`, the `_meta` it sends."""
    return {"hatp/journal": {"runId": RUN_ID}}


async def main() -> None:
    server = MCPServerStreamableHttp(
        params={"url": URL, "headers": {"Authorization": f"Bearer {TOKEN}"}},
        tool_meta_resolver=run_id,
    )
    async with server:
        tool = next(tool for tool in await server.list_tools() if tool.name == TOOL)
        started = time.monotonic()
        try:
            output = await MCPUtil.invoke_mcp_tool(server, tool, RunContextWrapper(context=None), ARGUMENTS)
            seen, failed = output if isinstance(output, str) else json.dumps(output, default=str), ""
        except Exception as exc:  # what the SDK's failure pipeline would hand the model instead
            seen, failed = "", f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - started
    print(json.dumps({"seen": seen, "failed": failed, "seconds": took}))


asyncio.run(main())
