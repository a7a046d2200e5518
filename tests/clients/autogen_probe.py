"""AutoGen's MCP workbench (tests/clients/autogen.txt) calling one tool through the Recorder as an AutoGen
agent does: `python autogen_probe.py URL TOKEN TOOL ARGUMENTS_JSON RUN_ID`, printing, as one JSON line,
what the agent's model would read of the tool's return and how long the call took.

The workbench is `McpWorkbench` over `StreamableHttpServerParams` with their defaults (one MCP session for the
workbench's life, a 300 s read timeout), and the run is named by the `Hatp-Run-Id` header (AutoGen sends no
`_meta` of the agent's with a call). No model provider is called."""

import asyncio
import json
import sys
import time

from autogen_ext.tools.mcp import McpWorkbench, StreamableHttpServerParams

URL, TOKEN, TOOL, ARGUMENTS, RUN_ID = sys.argv[1:6]


async def main() -> None:
    params = StreamableHttpServerParams(url=URL, headers={"Authorization": f"Bearer {TOKEN}",
                                                          "Hatp-Run-Id": RUN_ID})
    async with McpWorkbench(server_params=params) as workbench:
        started = time.monotonic()
        try:
            result = await workbench.call_tool(TOOL, json.loads(ARGUMENTS))
            seen, failed, is_error = result.to_text(), "", result.is_error
        except Exception as exc:  # what the agent's tool call would report instead
            seen, failed, is_error = "", f"{type(exc).__name__}: {exc}", True
        took = time.monotonic() - started
    print(json.dumps({"seen": seen, "failed": failed, "isError": is_error, "seconds": took}))


asyncio.run(main())
