"""The conformance matrix: every tool of every third-party server, through the Recorder and directly, with
the `mcp` SDK's client in both modes and with the official TypeScript SDK's client.

Servers (pinned): the npm reference server-everything (stdio and streamable HTTP), server-memory and
server-filesystem; PyPI's mcp-server-time, mcp-server-git and mcp-server-fetch (fetching from a local HTTP
server only). Each pairing runs the same calls against two identical fresh worlds (one reached directly,
one through the Recorder) and compares the results byte for byte, after removing what differs by nature
(the world's own directory, clock readings, each hop's envelope). Every call through the Recorder must be
journaled once, with the status the agent saw. `bench/conformance.py` prints the matrix.
"""

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from journal import services
from journal.models import Step
from tests.conftest import free_port
from tests.services import NODE_MODULES, needs_node

from .helpers import run_agent, without_advice
from .test_pairings import same, ts_client

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]

BIN = Path(sys.executable).parent
REFERENCE = NODE_MODULES / "@modelcontextprotocol"
CLIENTS = ["sdk-auto", "sdk-legacy", "typescript"]
FIXED_DATE = "2026-11-30T12:00:00+00:00"
PAGE = ("<html><head><title>Ledger</title></head><body><h1>Quarterly ledger</h1><p>All entries "
        "balance.</p></body></html>")


def git(world: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=world, check=True, capture_output=True, env={
        **os.environ, "GIT_AUTHOR_DATE": FIXED_DATE, "GIT_COMMITTER_DATE": FIXED_DATE})


def make_world(kind: str, world: Path) -> None:
    world.mkdir(parents=True)
    if kind == "filesystem":
        (world / "notes.txt").write_text("first line\nsecond line\n")
        (world / "sub").mkdir()
        (world / "sub" / "deep.txt").write_text("deep\n")
        (world / "pixel.png").write_bytes(bytes.fromhex(
            "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
            "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"))
    elif kind == "git":
        git(world, "init", "-q", "-b", "main")
        git(world, "config", "user.email", "ci@example.test")
        git(world, "config", "user.name", "CI")
        (world / "a.txt").write_text("one\n")
        git(world, "add", "a.txt")
        git(world, "commit", "-q", "-m", "first")


def command(kind: str, world: Path, site: str) -> list[str]:
    dated = ["env", f"GIT_AUTHOR_DATE={FIXED_DATE}", f"GIT_COMMITTER_DATE={FIXED_DATE}"]
    return {
        "everything": ["node", str(REFERENCE / "server-everything/dist/index.js"), "stdio"],
        "memory": ["env", f"MEMORY_FILE_PATH={world / 'memory.jsonl'}", "node",
                   str(REFERENCE / "server-memory/dist/index.js")],
        "filesystem": ["node", str(REFERENCE / "server-filesystem/dist/index.js"), str(world)],
        "time": [str(BIN / "mcp-server-time"), "--local-timezone", "Europe/Lisbon"],
        "git": [*dated, str(BIN / "mcp-server-git"), "--repository", str(world)],
        "fetch": [str(BIN / "mcp-server-fetch"), "--ignore-robots-txt", "--allow-private-ips"],
    }[kind]


def calls(kind: str, world: Path, site: str) -> list[tuple[str, dict]]:
    """One call or more of every tool the server lists, in an order that makes each meaningful."""
    root = str(world)
    return {
        "everything": [
            ("echo", {"message": "hi"}),
            ("get-sum", {"a": 2, "b": 3}),
            ("get-sum", {"a": "not a number"}),
            ("get-annotated-message", {"messageType": "success", "includeImage": True}),
            ("get-env", {}),
            ("get-resource-links", {"count": 2}),
            ("get-resource-reference", {"resourceType": "Blob", "resourceId": 2}),
            ("get-structured-content", {"location": "Chicago"}),
            ("get-tiny-image", {}),
            (
                "gzip-file-as-resource",
                {
                    "name": "hello.gz",
                    "data": "data:text/plain;base64,aGVsbG8gd29ybGQ=",
                    "outputType": "resource",
                },
            ),
            ("toggle-simulated-logging", {}),
            ("toggle-simulated-logging", {}),
            ("toggle-subscriber-updates", {}),
            ("toggle-subscriber-updates", {}),
            ("trigger-long-running-operation", {"duration": 0.3, "steps": 3}),
            ("simulate-research-query", {"topic": "ledgers"}),
        ],
        "memory": [
            (
                "create_entities",
                {
                    "entities": [
                        {"name": "Ada", "entityType": "person", "observations": ["writes programs"]},
                        {"name": "Engine", "entityType": "machine", "observations": ["computes"]},
                    ]
                },
            ),
            (
                "create_relations",
                {"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]},
            ),
            ("add_observations", {"observations": [{"entityName": "Ada", "contents": ["born 1815"]}]}),
            ("read_graph", {}),
            ("search_nodes", {"query": "Ada"}),
            ("open_nodes", {"names": ["Engine"]}),
            ("delete_observations", {"deletions": [{"entityName": "Ada", "observations": ["born 1815"]}]}),
            (
                "delete_relations",
                {"relations": [{"from": "Ada", "to": "Engine", "relationType": "programs"}]},
            ),
            ("delete_entities", {"entityNames": ["Engine"]}),
            ("read_graph", {}),
        ],
        "filesystem": [
            ("list_allowed_directories", {}),
            ("list_directory", {"path": root}),
            ("list_directory_with_sizes", {"path": root, "sortBy": "name"}),
            ("directory_tree", {"path": root}),
            ("read_text_file", {"path": f"{root}/notes.txt", "head": 1}),
            ("read_file", {"path": f"{root}/notes.txt"}),
            ("read_media_file", {"path": f"{root}/pixel.png"}),
            ("read_multiple_files", {"paths": [f"{root}/notes.txt", f"{root}/sub/deep.txt"]}),
            ("write_file", {"path": f"{root}/new.txt", "content": "fresh\n"}),
            ("edit_file", {"path": f"{root}/new.txt", "edits": [{"oldText": "fresh", "newText": "edited"}]}),
            ("create_directory", {"path": f"{root}/made"}),
            ("move_file", {"source": f"{root}/new.txt", "destination": f"{root}/made/new.txt"}),
            ("search_files", {"path": root, "pattern": "**/*.txt"}),
            ("get_file_info", {"path": f"{root}/notes.txt"}),
            ("read_text_file", {"path": "/etc/hostname"}),  # outside the allowed directory: a tool error
        ],
        "time": [
            ("get_current_time", {"timezone": "Asia/Tokyo"}),
            (
                "convert_time",
                {"source_timezone": "Europe/London", "time": "09:30", "target_timezone": "Asia/Tokyo"},
            ),
            (
                "convert_time",
                {"source_timezone": "Nowhere/Else", "time": "09:30", "target_timezone": "Asia/Tokyo"},
            ),
        ],
        "git": [
            ("git_status", {"repo_path": root}),
            ("git_log", {"repo_path": root, "max_count": 5}),
            ("git_branch", {"repo_path": root, "branch_type": "local"}),
            ("git_create_branch", {"repo_path": root, "branch_name": "feature"}),
            ("git_checkout", {"repo_path": root, "branch_name": "feature"}),
            ("git_diff_unstaged", {"repo_path": root}),
            ("git_add", {"repo_path": root, "files": ["a.txt"]}),
            ("git_diff_staged", {"repo_path": root}),
            ("git_commit", {"repo_path": root, "message": "second"}),
            ("git_diff", {"repo_path": root, "target": "main"}),
            ("git_show", {"repo_path": root, "revision": "HEAD"}),
            ("git_reset", {"repo_path": root}),
            ("git_status", {"repo_path": "/nonexistent"}),
        ],
        "fetch": [("fetch", {"url": site}), ("fetch", {"url": site, "raw": True, "max_length": 40})],
    }[kind]


# What differs between two runs by nature: the world's own directory, clock readings (also inside a text
# blob, which is compared decoded) and the session ids a server names.
_CLOCK = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?"
    r"|\w{3} \w{3} \d\d \d{4} \d\d:\d\d:\d\d GMT[+-]\d{4}( \([^)]*\))?|\d{1,2}:\d\d:\d\d [AP]M"
)


_SESSION = re.compile(
    r"session [0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)  # a server's session id


def _decoded(value):
    if isinstance(value, dict):
        return {k: _text_blob(v) if k == "blob" else _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


def _text_blob(blob):
    try:
        return "text blob: " + base64.b64decode(blob, validate=True).decode("utf-8")
    except (ValueError, TypeError):
        return blob


def normalised(result, world: Path):
    text = json.dumps(_decoded(result), sort_keys=True).replace(str(world), "<WORLD>")
    return json.loads(_SESSION.sub("<SESSION>", _CLOCK.sub("<CLOCK>", text)))


def sdk_calls(target, mode: str, todo) -> list:
    async def main():
        async with Client(target, mode=mode, cache=None) as client:
            return await _each(client, todo)

    return anyio.run(main)


async def _each(client, todo) -> list:
    results = []
    for tool, arguments in todo:
        try:
            results.append(same(await client.call_tool(tool, arguments)))
        except MCPError as exc:
            results.append({"error": exc.error.model_dump(mode="json", exclude_none=True)})
    return results


def ts_calls(target: str, token: str, todo) -> list:
    return ts_client(target, token, todo)["results"]


def strip_error_data(results) -> list:
    """An error's `data` from the TypeScript client is null when absent; the SDK's leaves it out."""
    return [
        {"error": {k: v for k, v in r["error"].items() if v is not None}} if "error" in r else r
        for r in results
    ]


@pytest.fixture(scope="module")
def site():
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ledger.html"
    server.shutdown()


@pytest.fixture(scope="module")
def everything_http():
    port = free_port()
    process = subprocess.Popen(
        ["node", str(REFERENCE / "server-everything/dist/index.js"), "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx2.get(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except httpx2.TransportError:
            assert time.monotonic() < deadline, "server-everything did not start over streamable HTTP"
            time.sleep(0.1)
    yield url
    process.terminate()
    process.wait(timeout=10)


SERVERS = ["everything", "everything-http", "memory", "filesystem", "time", "git", "fetch"]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", SERVERS)
def test_every_tool_through_the_recorder_answers_as_it_does_directly(
        recorder, dana, tmp_path, site, everything_http, kind, client):
    name = kind.replace("-", "")
    base = "everything" if kind == "everything-http" else kind
    direct_world, through_world = tmp_path / "direct" / "world", tmp_path / "through" / "world"
    make_world(base, direct_world)
    make_world(base, through_world)
    todo = calls(base, through_world, site)
    direct_todo = calls(base, direct_world, site)
    if kind == "everything-http":
        server = services.register_tool_server(name=name, url=everything_http)
        direct_target = everything_http
    else:
        server = services.register_tool_server(
            name=name, command=" ".join(command(base, through_world, site))
        )
        direct_target = "stdio:" + " ".join(command(base, direct_world, site))
    services.refresh_catalogue(server=server)
    server.refresh_from_db()
    assert {tool["name"] for tool in server.catalogue} == {tool for tool, _ in todo}, "a tool is left out"
    _, token = services.create_agent(name=f"agent-{client}", on_behalf_of=dana)

    through_todo = [(f"{name}__{tool}", arguments) for tool, arguments in todo]
    if client == "typescript":
        direct = ts_calls(direct_target, "", direct_todo)
        through = ts_calls(f"{recorder.base}/mcp/", token, through_todo)
        direct, through = strip_error_data(direct), strip_error_data(through)
    else:
        mode = client.removeprefix("sdk-")
        if direct_target.startswith("stdio:"):
            argv = direct_target.removeprefix("stdio:").split(" ")
            target = StdioServerParameters(command=argv[0], args=argv[1:])
            direct = sdk_calls(target, mode, direct_todo)
        else:
            async def over_http():
                async with httpx2.AsyncClient(timeout=30) as http, Client(
                        streamable_http_client(direct_target, http_client=http), mode=mode, cache=None) as c:
                    return await _each(c, direct_todo)
            direct = anyio.run(over_http)
        through = run_agent(recorder, token, lambda c: _each(c, through_todo), mode=mode)
    assert normalised(without_advice(through), through_world) == normalised(direct, direct_world)
    steps = list(Step.objects.filter(server_name=name).order_by("number").values_list("tool", "status"))
    assert steps == [(tool, "error" if "error" in result or result.get("isError") else "ok")
                     for (tool, _), result in zip(todo, through, strict=True)]


def test_the_typescript_client_reads_a_resource_gets_a_prompt_and_a_five_megabyte_result(
        recorder, dana, sample_servers):
    register = services.register_tool_server
    services.refresh_catalogue(
        server=register(name="everything", command=" ".join(command("everything", Path(), "")))
    )
    services.refresh_catalogue(server=register(name="big", url=sample_servers.url("legacy")))
    _, token = services.create_agent(name="ts-agent", on_behalf_of=dana)
    direct = ts_calls("stdio:" + " ".join(command("everything", Path(), "")), "", [
        ["#read", {"uri": "demo://resource/static/document/architecture.md"}],
        ["#prompt", {"name": "args-prompt", "arguments": {"city": "Lisbon"}}]])
    through = ts_calls(f"{recorder.base}/mcp/", token, [
        ["#read", {"uri": "recorder://everything/demo://resource/static/document/architecture.md"}],
        ["#prompt", {"name": "everything__args-prompt", "arguments": {"city": "Lisbon"}}],
        ["big__blob", {"size": 5 * 1024 * 1024}]])
    assert through[:2] == direct and direct[0]["contents"][0]["uri"] == "demo://resource/static/document/architecture.md"
    assert through[2]["content"][0]["text"] == "x" * 5 * 1024 * 1024
    assert list(Step.objects.order_by("number").values_list("tool", "status")) == [
        ("resources/read", "ok"), ("blob", "ok")]
