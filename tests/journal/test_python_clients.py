"""The Python MCP clients people build agents with, through the Recorder and directly: the `fastmcp` client,
LangChain's MCP adapters and pydantic-ai's MCP toolset (each pinned, in an environment of its own:
tests/clients/*.txt), against the reference server-everything over streamable HTTP.

Each client's probe (tests/clients/*_probe.py) lists and calls tools (one ending in a tool error), lists and
reads resources, gets a prompt, and calls the tools that report progress, ask the user (elicitation) and ask
the model (sampling), answering as a person and a model would; what it got through the Recorder must be what
it got directly, feature by feature, with only the Recorder's names taken off (`everything__`, and
`recorder://everything/` on a listed resource's URI).
"""

import json
import subprocess
from pathlib import Path

import pytest

from journal import services
from journal.models import Step
from tests.conftest import free_port
from tests.services import client_python, needs_node, needs_python_clients, serving

from .helpers import settle
from .test_conformance import REFERENCE

pytestmark = [pytest.mark.django_db(transaction=True), needs_node, needs_python_clients]

PROBES = Path(__file__).resolve().parent.parent / "clients"
# What each client can do (the adapters cannot answer a server's sampling request, so they are not asked).
FEATURES = {
    "fastmcp": ("tools", "call", "error", "resources", "read", "prompt", "progress", "elicitation",
                "sampling"),
    "langchain": ("tools", "call", "error", "resources", "read", "prompt", "progress", "elicitation"),
    "pydantic-ai": ("tools", "call", "error", "resources", "read", "prompt", "progress", "elicitation",
                    "sampling"),
}


@pytest.fixture(scope="module")
def everything():
    port = free_port()
    with serving(["node", str(REFERENCE / "server-everything/dist/index.js"), "streamableHttp"], port,
                 "server-everything", env={"PORT": str(port)}):
        yield f"http://127.0.0.1:{port}/mcp"


def probe(client: str, url: str, token: str = "", prefix: str = "") -> dict:
    script = PROBES / f"{client.replace('-', '_')}_probe.py"
    done = subprocess.run([client_python(client), str(script), url, token, prefix], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, f"{client} failed: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def without_recorder_names(value):
    if isinstance(value, dict):
        return {k: without_recorder_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_recorder_names(item) for item in value]
    return value.replace("recorder://everything/", "") if isinstance(value, str) else value


@pytest.mark.parametrize("client", list(FEATURES))
def test_a_python_client_gets_through_the_recorder_what_it_gets_directly(recorder, dana, everything, client,
                                                                         record_property):
    services.refresh_catalogue(server=services.register_tool_server(name="everything", url=everything))
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    direct = probe(client, everything)
    through = without_recorder_names(probe(client, f"{recorder.base}/mcp/", token, "everything__"))
    record_property("features", ",".join(FEATURES[client]))
    for feature in FEATURES[client]:
        assert through.get(feature) == direct.get(feature), feature
    # Not vacuous: each feature did what it does.
    assert {"echo", "trigger-elicitation-request"} <= set(direct["tools"])
    assert direct["progress"] == [1.0, 2.0, 3.0]
    assert "Ada" in json.dumps(direct["elicitation"])
    assert "four" in json.dumps(direct.get("sampling", "four"))
    assert "Lisbon" in json.dumps(direct["prompt"]) and "Everything Server" in json.dumps(direct["read"])
    settle(recorder)
    tools = list(Step.objects.order_by("started_at").values_list("tool", flat=True))
    assert "trigger-elicitation-request" in tools and "echo" in tools and "resources/read" in tools
