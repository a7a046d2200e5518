"""Agents and servers on every handshake version the specification has had since streamable HTTP
(2025-03-26, 2025-06-18, 2025-11-25), and on the stateless 2026-07-28: a raw JSON-RPC client at each version
gets through the Recorder what it gets from the server directly at that version."""

import json
import subprocess
import sys
from pathlib import Path

import httpx
import mcp_types as types
import pytest

from journal import services
from journal.mcp import versions
from journal.models import Step
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server
from tests.services import NODE_MODULES, needs_node

from .helpers import run_agent

pytestmark = pytest.mark.django_db(transaction=True)

OLDER = ["2025-03-26", "2025-06-18", "2025-11-25"]
EVERYTHING = ["node", str(NODE_MODULES / "@modelcontextprotocol/server-everything/dist/index.js"), "stdio"]
TIME = [str(Path(sys.executable).parent / "mcp-server-time")]
CALLS = {
    "everything": [
        ("get-structured-content", {"location": "Chicago"}),
        ("get-resource-links", {"count": 1}),
        ("get-sum", {"a": 1, "b": 2}),
    ],
    "time": [
        (
            "convert_time",
            {"source_timezone": "Europe/London", "time": "09:30", "target_timezone": "Asia/Tokyo"},
        )
    ],
}


def _message(response: httpx.Response, request_id: int) -> dict:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for event in response.text.replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(line[5:].strip() for line in event.split("\n") if line.startswith("data:"))
            if data and json.loads(data).get("id") == request_id:
                return json.loads(data)
        raise AssertionError(f"no answer to request {request_id} in the stream")
    return response.json()


class RawAgent:
    """A handshake client at any protocol version, speaking JSON-RPC over streamable HTTP by hand (a
    2025-03-26 client sends no Mcp-Protocol-Version header)."""

    def __init__(self, url: str, token: str, version: str, capabilities: dict | None = None):
        self.url, self.version, self.ids = url, version, 0
        self.http = httpx.Client(
            timeout=30,
            headers={
                "Accept": "application/json, text/event-stream",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            },
        )
        answer = self.rpc("initialize", {"protocolVersion": version, "capabilities": capabilities or {},
                                         "clientInfo": {"name": "raw", "version": "1"}})
        self.negotiated = answer["result"]["protocolVersion"]
        self.http.post(
            self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        ).raise_for_status()

    def rpc(self, method: str, params: dict) -> dict:
        self.ids += 1
        response = self.http.post(
            self.url, json={"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        )
        if "mcp-session-id" in response.headers:
            self.http.headers["mcp-session-id"] = response.headers["mcp-session-id"]
            if self.version != "2025-03-26":
                self.http.headers["mcp-protocol-version"] = self.version
        return _message(response, self.ids)

    def close(self) -> None:
        self.http.delete(self.url)
        self.http.close()


def direct_stdio(argv: list[str], version: str, calls) -> tuple[str, list]:
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)

    def rpc(request_id, method, params):
        process.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + "\n"
        )
        process.stdin.flush()
        while True:
            message = json.loads(process.stdout.readline())
            if message.get("id") == request_id:
                return message

    try:
        negotiated = rpc(
            0,
            "initialize",
            {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
        )["result"]["protocolVersion"]
        process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        process.stdin.flush()
        return negotiated, [rpc(n + 1, "tools/call", {"name": tool, "arguments": arguments})["result"]
                            for n, (tool, arguments) in enumerate(calls)]
    finally:
        process.kill()
        process.wait()


def mine(result: dict) -> dict:
    """A result without the envelope its hop stamps, and without `resultType`, which a 2026 server sends
    every client and the Recorder sends only 2026 clients."""
    result = versions.from_server(result)
    result.pop("resultType", None)
    return result


@pytest.fixture
def token(dana):
    return services.create_agent(name="bot", on_behalf_of=dana)[1]


@pytest.mark.parametrize("version", OLDER)
@pytest.mark.parametrize("server", [pytest.param("everything", marks=needs_node), "time"])
def test_an_agent_on_any_handshake_version_gets_what_it_would_directly(recorder, token, version, server):
    argv = EVERYTHING if server == "everything" else TIME
    services.refresh_catalogue(server=services.register_tool_server(name=server, command=" ".join(argv)))
    negotiated, direct = direct_stdio(argv, version, CALLS[server])
    agent = RawAgent(f"{recorder.base}/mcp/", token, version)
    try:
        through = [agent.rpc("tools/call", {"name": f"{server}__{tool}", "arguments": arguments})["result"]
                   for tool, arguments in CALLS[server]]
    finally:
        agent.close()
    assert agent.negotiated == negotiated == version
    assert [mine(r) for r in through] == [mine(r) for r in direct]
    assert "resultType" not in through[0]  # not a field of any handshake version
    assert Step.objects.filter(status="ok").count() == len(CALLS[server])


@pytest.mark.parametrize("version", OLDER)
def test_a_server_on_any_handshake_version_serves_every_agent(recorder, token, version):
    """The server answers the Recorder's initialize with an older version, as an older server does; agents
    on the 2026 protocol and on each handshake version all reach it."""
    with ServerThread(handshake_server.build_app(version=version), free_port()) as upstream:
        services.refresh_catalogue(
            server=services.register_tool_server(name="memo", url=f"{upstream.base}/mcp")
        )
        answers = []
        for agent_version in OLDER:
            agent = RawAgent(f"{recorder.base}/mcp/", token, agent_version)
            try:
                agent.rpc("tools/call", {"name": "memo__remember", "arguments": {"value": agent_version}})
                answers.append(agent.rpc("tools/call", {"name": "memo__recall", "arguments": {}})["result"])
            finally:
                agent.close()

        async def stateless(client):
            await client.call_tool("memo__remember", {"value": "2026-07-28"})
            return (await client.call_tool("memo__recall", {})).content[0].text

        answers.append({"content": [{"text": run_agent(recorder, token, stateless, mode="auto")}]})
    assert [a["content"][0]["text"] for a in answers] == [
        *OLDER,
        "2026-07-28",
    ]  # a session each, upstream too
    assert Step.objects.filter(status="ok").count() == 2 * len(OLDER) + 2


def test_each_upstream_session_declares_exactly_what_its_agent_declared(recorder, token):
    """An agent that takes form elicitations only, and lists roots without saying when they change: the
    server sees those capabilities through the Recorder, as it would directly, and nothing more."""
    declared = {"elicitation": {"form": {}}, "roots": {}}
    with ServerThread(handshake_server.build_app(), free_port()) as upstream:
        services.refresh_catalogue(
            server=services.register_tool_server(name="memo", url=f"{upstream.base}/mcp")
        )
        seen = []
        for url, name, key in (
            (f"{upstream.base}/mcp", "capabilities", ""),
            (f"{recorder.base}/mcp/", "memo__capabilities", token),
        ):
            agent = RawAgent(url, key, "2025-11-25", capabilities=declared)
            try:
                seen.append(
                    json.loads(
                        agent.rpc("tools/call", {"name": name, "arguments": {}})["result"]["content"][0][
                            "text"
                        ]
                    )
                )
            finally:
                agent.close()
    assert seen[1] == seen[0] == declared


def test_two_2026_clients_of_one_agent_each_have_their_own_upstream_session(recorder, token):
    """Issue 24, 3: every 2026-07-28 client of one agent shared one upstream session, with the capabilities
    of whichever opened it, and a server's per-session state leaked from one client to the next. A
    stateless client is known by the client info and capabilities each of its requests declares."""
    async def elicit(context, params):
        return types.ElicitResult(action="decline")

    with ServerThread(handshake_server.build_app(), free_port()) as upstream:
        services.refresh_catalogue(
            server=services.register_tool_server(name="memo", url=f"{upstream.base}/mcp")
        )

        def client(name, script, **options):
            return run_agent(recorder, token, script, mode="auto",
                             client_info=types.Implementation(name=name, version="1"), **options)

        async def remember(c):
            await c.call_tool("memo__remember", {"value": "the planner's"})
            return (await c.call_tool("memo__recall", {})).content[0].text

        async def recall(c):
            return (await c.call_tool("memo__recall", {})).content[0].text

        async def capabilities(c):
            return json.loads((await c.call_tool("memo__capabilities", {})).content[0].text)

        assert client("planner", remember) == "the planner's"
        assert client("planner", recall) == "the planner's"  # the same program again: its session
        assert client("reviewer", recall) == "nothing"  # another program of the agent: a session of its own
        asking = client("asker", capabilities, elicitation_callback=elicit)
        silent = client("silent", capabilities)
    assert "elicitation" in asking and "elicitation" not in silent
