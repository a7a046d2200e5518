"""pydantic-ai's MCP toolset (tests/clients/pydantic-ai.txt) through one server:
`python pydantic_ai_probe.py URL TOKEN PREFIX`, printing what it got for each feature (tools, a call, a tool
error, resources, prompts, progress, elicitation, sampling), as tests/clients/fastmcp_probe.py does.

The tools are called by an agent on a scripted model (pydantic-ai's FunctionModel: no model provider is
asked), which calls each in turn and then answers; what the agent's model saw of each tool's return is what
is compared."""

import asyncio
import json
import sys

from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

URL, TOKEN, PREFIX = sys.argv[1:4]
PROGRESS: list[float] = []
CALLS = [
    ("echo", {"message": "hi"}),
    ("get-sum", {"a": "x"}),
    ("trigger-long-running-operation", {"duration": 0.3, "steps": 3}),
    ("trigger-elicitation-request", {}),
    ("trigger-sampling-request", {"prompt": "2+2?"}),
]


async def elicit(message, response_type, params, context):
    return {"name": "Ada", "check": True, "integer": 3}


async def sample(messages, params, context):
    return "four"


async def progress(done, total, message):
    PROGRESS.append(done)


def script(messages, info):
    """Call the next tool of CALLS, or answer once every one has returned."""
    made = sum(isinstance(part, ToolCallPart) for message in messages
               for part in getattr(message, "parts", []))
    if made < len(CALLS):
        tool, arguments = CALLS[made]
        return ModelResponse(parts=[ToolCallPart(tool_name=f"{PREFIX}{tool}", args=arguments,
                                                 tool_call_id=f"call-{made}")])
    return ModelResponse(parts=[TextPart("done")])


def returned(value):
    if isinstance(value, list):
        return [returned(item) for item in value]
    return value if isinstance(value, str | int | float | bool | dict | type(None)) else str(value)


async def main() -> dict:
    toolset = MCPToolset(URL, headers={"Authorization": f"Bearer {TOKEN}"} if TOKEN else None,
                         elicitation_handler=elicit, sampling_handler=sample, progress_handler=progress,
                         tool_error_behavior="failed")
    agent = Agent(FunctionModel(script), toolsets=[toolset])
    async with toolset:
        tools = sorted(tool.name.removeprefix(PREFIX) for tool in await toolset.list_tools())
        resources = await toolset.list_resources()
        read = await toolset.read_resource(resources[0].uri)
        prompt = await toolset.get_prompt(f"{PREFIX}args-prompt", {"city": "Lisbon", "state": "PT"})
        run = await agent.run("Use every tool once.")
    returns = [part for message in run.all_messages() for part in getattr(message, "parts", [])
               if isinstance(part, ToolReturnPart) or type(part).__name__ == "RetryPromptPart"]
    seen = {CALLS[int(part.tool_call_id.split("-")[1])][0]: returned(getattr(part, "content", None))
            for part in returns}
    return {
        "tools": tools,
        "call": seen.get("echo"),
        "error": seen.get("get-sum"),
        "resources": [resource.uri for resource in resources[:3]],
        "read": returned(read),
        "prompt": returned(list(getattr(prompt, "messages", [prompt]))),
        "progress": PROGRESS,
        "elicitation": seen.get("trigger-elicitation-request"),
        "sampling": seen.get("trigger-sampling-request"),
        "answer": run.output,
    }


print(json.dumps(asyncio.run(main())))
