"""The fastmcp client (tests/clients/fastmcp.txt) through one server:
`python fastmcp_probe.py URL TOKEN PREFIX`.

Prints one JSON object: what the client got for each feature of server-everything (tools, a call, a tool
error, resources, prompts, progress, elicitation, sampling), with PREFIX before every name ("" directly,
"everything__" through the Recorder) and TOKEN ("" for none) as its bearer token. Run once directly and once
through the Recorder by tests/journal/test_python_clients.py, which compares the two."""

import asyncio
import json
import sys

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

URL, TOKEN, PREFIX = sys.argv[1:4]
PROGRESS: list[float] = []


def dumped(value):
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


async def elicit(message, response_type, params, context):
    return {"name": "Ada", "check": True, "integer": 3}


async def sample(messages, params, context):
    return "four"


async def progress(done, total, message):
    PROGRESS.append(done)


async def main() -> dict:
    transport = StreamableHttpTransport(URL, headers={"Authorization": f"Bearer {TOKEN}"} if TOKEN else None)
    async with Client(transport, elicitation_handler=elicit, sampling_handler=sample, timeout=30) as client:
        tools = sorted(tool.name.removeprefix(PREFIX) for tool in await client.list_tools())
        call = await client.call_tool(f"{PREFIX}echo", {"message": "hi"})
        error = await client.call_tool(f"{PREFIX}get-sum", {"a": "x"}, raise_on_error=False)
        resources = await client.list_resources()
        read = await client.read_resource(resources[0].uri)
        prompt = await client.get_prompt(f"{PREFIX}args-prompt", {"city": "Lisbon", "state": "PT"})
        await client.call_tool(f"{PREFIX}trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                               progress_handler=progress)
        elicited = await client.call_tool(f"{PREFIX}trigger-elicitation-request", {})
        sampled = await client.call_tool(f"{PREFIX}trigger-sampling-request", {"prompt": "2+2?"})
    return {
        "tools": tools,
        "call": [dumped(block) for block in call.content],
        "error": {"isError": error.is_error, "content": [dumped(block) for block in error.content]},
        "resources": [str(resource.uri) for resource in resources[:3]],
        "read": [dumped(content) for content in read],
        "prompt": [dumped(message) for message in prompt.messages],
        "progress": PROGRESS,
        "elicitation": [dumped(block) for block in elicited.content],
        "sampling": [dumped(block) for block in sampled.content],
    }


print(json.dumps(asyncio.run(main())))
