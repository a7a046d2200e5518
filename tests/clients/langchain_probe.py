"""LangChain's MCP adapters (tests/clients/langchain.txt) through one server:
`python langchain_probe.py URL TOKEN PREFIX`, printing what the client got for each feature it has (tools, a
call, a tool error, resources, prompts, progress, elicitation; the adapters cannot answer sampling), as
tests/clients/fastmcp_probe.py does. The adapters open a new MCP session for every tool call."""

import asyncio
import json
import sys

from langchain_mcp_adapters.callbacks import Callbacks
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.resources import load_mcp_resources
from mcp import types

URL, TOKEN, PREFIX = sys.argv[1:4]
PROGRESS: list[float] = []


async def elicit(mcp_context, params, context):
    return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "integer": 3})


async def progress(done, total, message, context):
    PROGRESS.append(done)


def content(value):
    """A tool's output as the adapters give it: text, or a list of blocks."""
    if isinstance(value, list):
        return [{k: v for k, v in block.items() if k != "id"} if isinstance(block, dict) else block
                for block in value]
    return value


async def main() -> dict:
    connection = {"transport": "streamable_http", "url": URL,
                  **({"headers": {"Authorization": f"Bearer {TOKEN}"}} if TOKEN else {})}
    client = MultiServerMCPClient({"everything": connection},
                                  callbacks=Callbacks(on_progress=progress, on_elicitation=elicit))
    tools = {tool.name.removeprefix(PREFIX): tool for tool in await client.get_tools()}
    call = await tools["echo"].ainvoke({"message": "hi"})
    error = await tools["get-sum"].ainvoke({"a": "x"})
    async with client.session("everything") as session:
        listed = (await session.list_resources()).resources[:3]
        blobs = await load_mcp_resources(session, uris=[str(resource.uri) for resource in listed[:1]])
    prompt = await client.get_prompt("everything", f"{PREFIX}args-prompt",
                                     arguments={"city": "Lisbon", "state": "PT"})
    await tools["trigger-long-running-operation"].ainvoke({"duration": 0.3, "steps": 3})
    elicited = await tools["trigger-elicitation-request"].ainvoke({})
    return {
        "tools": sorted(tools),
        "call": content(call),
        "error": content(error),
        "resources": [str(resource.uri) for resource in listed],
        "read": [{"mimetype": blob.mimetype, "data": blob.as_string()} for blob in blobs],
        "prompt": [{"type": message.type, "content": message.content} for message in prompt],
        "progress": PROGRESS,
        "elicitation": content(elicited),
    }


print(json.dumps(asyncio.run(main())))
