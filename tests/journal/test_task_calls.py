"""The MCP tasks extension (SEP-2663) through the Recorder, against a real task server (fastmcp-tasks).

A 2026-07-28 agent that declares the extension gets what it would get directly: a task handle for a tool
that runs as a task, then the task's status and result by `tasks/get`; `tasks/cancel` reaches the server. The
call is journaled once, in flight while the task runs and with its outcome when the task ends.
"""

import json
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
from django.utils import timezone

from approver import planning
from approver.services.plans import step_facts
from journal import services
from journal.models import ChainEntry, Step
from tests.conftest import ServerThread, free_port
from tests.services import client_python, needs_python_clients, serving

from .helpers import settle

pytestmark = [pytest.mark.django_db(transaction=True), needs_python_clients]

VERSION = "2026-07-28"
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "tasks_server.py"


@pytest.fixture(scope="module")
def task_server():
    port = free_port()
    with serving([client_python("fastmcp"), str(SERVER), str(port)], port, "the fastmcp-tasks server"):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def token(task_server, dana):
    services.refresh_catalogue(server=services.register_tool_server(name="tasks", url=task_server))
    return services.create_agent(name="batch-bot", on_behalf_of=dana)[1]


def rpc(url: str, method: str, params: dict, *, name: str = "", token: str = "",
        capabilities: dict | None = None) -> dict:
    """One 2026-07-28 request, as an SDK would send it (the `_meta` envelope, the Mcp-* headers): the JSON-RPC
    answer, whether it came as JSON or as an event stream."""
    meta = {"io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "batch-bot", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": TASKS if capabilities is None else capabilities}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": VERSION, "mcp-method": method, "mcp-name": name,
               **({"authorization": f"Bearer {token}"} if token else {})}
    return answer_of(httpx2.post(url, content=json.dumps(body), headers=headers, timeout=30))


def answer_of(response) -> dict:
    """The JSON-RPC answer, whether it came as JSON or as an event stream ({} when there is none)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1]) if data else {}
    return response.json() if response.content else {}


def call(url, tool, arguments, **options) -> dict:
    return rpc(url, "tools/call", {"name": tool, "arguments": arguments}, name=tool, **options)


def until_ended(url, task_id: str, **options) -> dict:
    deadline = time.monotonic() + 20
    while True:
        answer = rpc(url, "tasks/get", {"taskId": task_id}, name=task_id, **options)
        if "error" in answer or answer["result"]["status"] in ("completed", "failed", "cancelled"):
            return answer
        assert time.monotonic() < deadline, f"task {task_id} never ended: {answer}"
        time.sleep(0.1)


def bare(answer: dict) -> dict:
    """An answer without what differs between two runs of the same call: ids, times and the serverInfo."""
    result = dict(answer.get("result") or {})
    for key in ("taskId", "createdAt", "lastUpdatedAt", "_meta"):
        result.pop(key, None)
    if isinstance(result.get("result"), dict):
        result["result"] = {k: v for k, v in result["result"].items() if k != "_meta"}
    return result


@pytest.fixture
def on_call_client(client, on_call):
    client.force_login(on_call)
    return client


def test_a_task_runs_through_the_recorder_as_it_does_directly_and_is_journaled_once(recorder, task_server,
                                                                                      token, on_call_client):
    through = f"{recorder.base}/mcp/"
    # Long enough that the step is still in flight when looked at (the Recorder follows it meanwhile).
    direct_handle = call(task_server, "crunch", {"n": 1, "seconds": 3})
    handle = call(through, "tasks__crunch", {"n": 2, "seconds": 3}, token=token)
    assert handle["result"]["resultType"] == "task" and handle["result"]["status"] == "working"
    assert bare(handle) == bare(direct_handle)
    task_id = handle["result"]["taskId"]
    assert task_id.startswith("tasks__")  # named as the agent names the server's tools
    settle(recorder)
    step = Step.objects.get()
    # In flight, its outcome unknown while the task runs:
    assert (step.status, step.task_id) == ("pending", task_id.removeprefix("tasks__"))
    assert step.task_until is not None  # its time to live, from the handle
    page = on_call_client.get(f"/runs/{step.run.public_id}/").content.decode()
    assert f"Running as a task on tasks (task <code>{step.task_id}</code>)" in page
    [item] = planning.draft_items(step_facts(step.run), {1: planning.Pull("chosen")}, plan_id="p",
                                  key_secret=b"k", now=timezone.now())
    assert item.action == "cannot_undo" and "still running this call as a task" in item.reason

    ended = until_ended(through, task_id, token=token)
    direct = until_ended(task_server, direct_handle["result"]["taskId"])
    assert ended["result"]["taskId"] == task_id
    assert bare(ended) == {**bare(direct), "result": {**bare(direct)["result"], "content": [
        {"type": "text", "text": "added 2"}], "structuredContent": {"result": "added 2"}}}
    until_ended(through, task_id, token=token)  # asked again: journaled once all the same
    settle(recorder)
    step.refresh_from_db()
    assert Step.objects.count() == 1
    assert (step.status, step.result["content"][0]["text"]) == ("ok", "added 2")
    events = list(ChainEntry.objects.filter(run=step.run).order_by("seq").values_list("event", flat=True))
    assert events.count("task") == 1 and events.count("result") == 1
    assert events.index("call") < events.index("task") < events.index("result")
    assert services.verify_run(run=step.run).ok


def test_without_the_extension_declared_the_servers_own_refusal_arrives_and_nothing_is_a_task(
        recorder, task_server, token):
    """Before, the Recorder never passed the agent's declaration on: every task tool failed like this."""
    direct = call(task_server, "crunch", {"n": 1}, capabilities={})
    through = call(f"{recorder.base}/mcp/", "tasks__crunch", {"n": 1}, token=token, capabilities={})
    assert through["error"]["code"] == direct["error"]["code"] == -32021
    assert through["error"]["message"] == direct["error"]["message"]
    settle(recorder)
    assert Step.objects.get().task_id == ""


def test_a_tool_that_may_run_as_a_task_does_so_when_the_agent_can_take_one(recorder, token):
    through = f"{recorder.base}/mcp/"
    handle = call(through, "tasks__tally", {"n": 5}, token=token)
    assert handle["result"]["resultType"] == "task"  # before: run inline, as if the agent could not
    assert until_ended(through, handle["result"]["taskId"], token=token)["result"]["result"]["content"] == [
        {"type": "text", "text": "tallied 5"}]


def test_a_cancelled_task_is_journaled_as_the_agents_cancel(recorder, token):
    through = f"{recorder.base}/mcp/"
    task_id = call(through, "tasks__stall", {"seconds": 30}, token=token)["result"]["taskId"]
    assert rpc(through, "tasks/cancel", {"taskId": task_id}, name=task_id, token=token)["result"] == {
        "resultType": "complete", "_meta": {"io.modelcontextprotocol/serverInfo": {
            "name": "agent-undo-recorder", "version": "0.1.0"}}}
    assert until_ended(through, task_id, token=token)["result"]["status"] == "cancelled"
    settle(recorder)
    step = Step.objects.get()
    assert step.status == "cancelled" and step.may_have_acted
    entries = dict(ChainEntry.objects.filter(run=step.run).values_list("event", "data"))
    assert entries["task_cancel"] == {"step": 1, "taskId": step.task_id}
    assert services.verify_run(run=step.run).ok


def test_a_task_that_ends_in_a_tool_error_is_a_failed_call_with_advice(recorder, token):
    through = f"{recorder.base}/mcp/"
    task_id = call(through, "tasks__refuse", {"n": 3}, token=token)["result"]["taskId"]
    result = until_ended(through, task_id, token=token)["result"]["result"]
    assert result["isError"] is True and result["content"] == [{"type": "text", "text": "3 is not allowed"}]
    assert result["_meta"]["hatp/journal"]["recovery"]["action"]  # what the agent should do, as for any call
    settle(recorder)
    assert Step.objects.get().status == "error"


def test_only_the_agent_whose_call_made_a_task_can_ask_about_it(recorder, token, dana):
    through = f"{recorder.base}/mcp/"
    task_id = call(through, "tasks__crunch", {"n": 1}, token=token)["result"]["taskId"]
    other = services.create_agent(name="other-bot", on_behalf_of=dana)[1]
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        answer = rpc(through, method, {"taskId": task_id, "inputResponses": {}}, name=task_id, token=other)
        assert answer["error"]["code"] == -32602 and "no task" in answer["error"]["message"]
    answer = rpc(through, "tasks/get", {"taskId": task_id}, name=task_id, token=token, capabilities={})
    assert answer["error"]["code"] == -32021  # as the extension says, for a client that did not declare it
    assert until_ended(through, task_id, token=token)["result"]["status"] == "completed"


def test_a_task_nobody_saw_end_is_closed_as_unknown_once_its_time_to_live_is_over(recorder, token):
    through = f"{recorder.base}/mcp/"
    call(through, "tasks__stall", {"seconds": 20}, token=token)  # still at work when its time is over
    settle(recorder)
    later = timezone.now() + timedelta(hours=1)
    # Within its time to live, it may still be at work:
    assert services.reconcile_stale_steps(older_than=later, now=timezone.now()) == 0
    assert services.reconcile_stale_steps(older_than=later, now=later) == 1
    step = Step.objects.get()
    assert step.status == "error" and step.may_have_acted and "time to live" in step.error_message


FASTMCP_AGENT = """
import asyncio, json, sys
import fastmcp_tasks  # noqa: F401 - turns on the fastmcp client's task support
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

async def main():
    transport = StreamableHttpTransport(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
    async with Client(transport, timeout=30) as client:
        done = await client.call_tool("tasks__crunch", {"n": 7, "seconds": 0.2})
        optional = await client.call_tool("tasks__tally", {"n": 8})
        return [[block.text for block in done.content], [block.text for block in optional.content]]

print(json.dumps(asyncio.run(main())))
"""


def test_the_fastmcp_client_drives_a_task_through_the_recorder(recorder, token):
    done = subprocess.run([client_python("fastmcp"), "-c", FASTMCP_AGENT, f"{recorder.base}/mcp/", token],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["added 7"], ["tallied 8"]]
    settle(recorder)
    steps = [(s.tool, s.status, bool(s.task_id)) for s in Step.objects.order_by("started_at")]
    assert steps == [("crunch", "ok", True), ("tally", "ok", True)]


def wait_for_step(status: str, timeout: float = 20) -> Step:
    deadline = time.monotonic() + timeout
    while True:
        step = Step.objects.get()
        if step.status == status:
            return step
        assert time.monotonic() < deadline, f"the step is {step.status}, not {status}"
        time.sleep(0.2)


def test_the_recorder_journals_a_tasks_end_though_the_agent_never_asks(recorder, token):
    """Issue 43, finding 6: a task's outcome was journaled only when the agent polled; one that never
    called tasks/get left the step pending until the task's time to live while the server had acted."""
    call(f"{recorder.base}/mcp/", "tasks__crunch", {"n": 31, "seconds": 0.5}, token=token)
    step = wait_for_step("ok")
    assert step.result["content"][0]["text"] == "added 31"
    events = list(ChainEntry.objects.filter(run=step.run).order_by("seq").values_list("event", flat=True))
    assert events == ["run", "call", "task", "result"] and services.verify_run(run=step.run).ok


def test_a_task_in_flight_when_its_recorder_stopped_is_followed_by_the_next_to_start(recorder, token,
                                                                                     monkeypatch):
    """The Recorder that made the call stops following it (as if it had crashed a minute ago); of the next
    two Recorders to start, exactly one takes it over and journals its end, once."""
    from approver.asgi import build_application
    from journal.mcp.task_follower import ADOPT_AFTER, TaskFollower

    follow = TaskFollower.follow
    monkeypatch.setattr(TaskFollower, "follow", lambda *args, **kwargs: None)
    call(f"{recorder.base}/mcp/", "tasks__crunch", {"n": 32, "seconds": 3}, token=token)
    settle(recorder)
    time.sleep(1.5)
    assert Step.objects.get().status == "pending"  # nobody follows it
    quiet = timezone.now() - timedelta(seconds=ADOPT_AFTER + 1)
    Step.objects.update(task_seen_at=quiet, started_at=quiet)  # marked last a while ago: nobody follows it
    monkeypatch.setattr(TaskFollower, "follow", follow)
    with ServerThread(build_application(), free_port()) as one, ServerThread(build_application(),
                                                                            free_port()) as two:
        followers = [server.app.recorder.tasks.follower for server in (one, two)]
        deadline = time.monotonic() + 10
        while not any(follower.following for follower in followers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(len(follower.following) for follower in followers) == [0, 1]  # one follows it
        step = wait_for_step("ok")
    assert step.result["content"][0]["text"] == "added 32"
    assert ChainEntry.objects.filter(run=step.run, event="result").count() == 1


def test_a_request_that_does_not_accept_an_event_stream_is_told_why_it_is_refused(recorder, token):
    """MCP's streamable HTTP transport has the agent accept both JSON and an event stream; the SDK refuses a
    request that does not with a bare 406. The agent's developer is told what is wrong."""
    meta = {"io.modelcontextprotocol/protocolVersion": VERSION}
    for accept in ("application/json", "text/event-stream", ""):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                "params": {"taskId": "tasks__x", "_meta": meta}}
        response = httpx2.post(f"{recorder.base}/mcp/", content=json.dumps(body), timeout=30, headers={
            "authorization": f"Bearer {token}", "content-type": "application/json", "accept": accept,
            "mcp-protocol-version": VERSION, "mcp-method": "tasks/get", "mcp-name": "tasks__x"})
        assert response.status_code == 406, (accept, response.text)
        assert "must list both application/json and text/event-stream" in response.json()["error"]["message"]
