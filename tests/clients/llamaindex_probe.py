"""LlamaIndex's MCP tools (tests/clients/llamaindex.txt) calling one tool through the Recorder as a LlamaIndex
agent does: `python llamaindex_probe.py URL TOKEN TOOL ARGUMENTS_JSON RUN_ID`, printing, as one JSON line,
what the agent's model would read of the tool's return and how long the call took.

The client is `BasicMCPClient` with its defaults (a 30 s timeout, a new MCP session for every tool call), the
tool is the `FunctionTool` that `McpToolSpec` makes of it, and the run is named by the `Hatp-Run-Id` header
(LlamaIndex sends no `_meta` of the agent's with a call). No model provider is called."""

import asyncio
import json
import sys
import time

from llama_index.tools.mcp import BasicMCPClient, McpToolSpec

URL, TOKEN, TOOL, ARGUMENTS, RUN_ID = sys.argv[1:6]


async def main() -> None:
    client = BasicMCPClient(URL, headers={"Authorization": f"Bearer {TOKEN}", "Hatp-Run-Id": RUN_ID})
    tools = await McpToolSpec(client=client).to_tool_list_async()
    tool = next(tool for tool in tools if tool.metadata.name == TOOL)
    started = time.monotonic()
    try:
        output = await tool.acall(**json.loads(ARGUMENTS))
        seen, failed = output.content, ""
    except Exception as exc:  # what the agent's tool call would report instead
        seen, failed = "", f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - started
    print(json.dumps({"seen": seen, "failed": failed, "seconds": took}))


asyncio.run(main())
