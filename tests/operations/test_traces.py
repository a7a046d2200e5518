"""Traces in the OpenTelemetry MCP semantic conventions, sent to a real OTLP receiver the test starts: one
trace per agent call (its `tools/call` SERVER span, the child of the agent's own trace when its `_meta`
carries one, with the policy's decision, the journal's commits and the upstream call as children), and the
trace context in the tool server's request, in its headers and its `_meta`; and one trace for a plan, from
its request through its checks and signatures to each compensation, though they run in three processes."""

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from approver.models import Plan
from journal import services as journal_services
from journal.models import Run
from samples.app import build_app
from tests.conftest import Samples, ServerThread, free_port
from tests.journal.helpers import register_samples
from tests.otlp import Receiver
from tests.services import running_worker, worker_env_for_test_database

from .test_metrics import recorders, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
SERVER, CLIENT = 2, 3  # OTLP's span kinds
AGENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Seen:
    """The sample servers, keeping every POST they are sent (headers and JSON body)."""

    def __init__(self, app):
        self.app, self.posts = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        with contextlib.suppress(ValueError):
            self.posts.append(({k.decode(): v.decode() for k, v in scope["headers"]}, json.loads(body)))
        replay = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def replayed():
            return next(replay, None) or await receive()

        return await self.app(scope, replayed, send)

    def tool_calls(self, name: str) -> list[tuple[dict, dict]]:
        return [(h, b) for h, b in self.posts if isinstance(b, dict) and b.get("method") == "tools/call"
                and b["params"]["name"] == name]


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


@pytest.fixture
def seen_samples(tmp_path):
    app, servers = build_app(Path(tmp_path) / "samples")
    seen = Seen(app)
    with ServerThread(seen, free_port()) as thread:
        yield Samples(thread, servers), seen


async def agent_calls(url: str, token: str):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
            await client.call_tool("crm__get_deal", {"deal_id": "D-881"},
                                   meta={"hatp/journal": {"runId": "traced"}})
            await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"},
                                   meta={"hatp/journal": {"runId": "traced"},
                                         "traceparent": f"00-{AGENT_TRACE}-00f067aa0ba902b7-01"})
            missing = await client.call_tool("crm__get_deal", {"deal_id": "D-404"},
                                             meta={"hatp/journal": {"runId": "traced"}})
        async with Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client:
            await client.call_tool("crm__get_deal", {"deal_id": "D-881"},
                                   meta={"hatp/journal": {"runId": "traced"}})
    return missing


def test_one_trace_per_call_in_the_mcp_conventions_passed_on_to_the_tool_server(
        receiver, seen_samples, dana):
    samples, seen = seen_samples
    register_samples(samples, names=("crm",))
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    env = {**worker_env_for_test_database(), **receiver.env()}
    with recorders(env, workers=1) as base:
        missing = anyio.run(agent_calls, f"{base}/mcp/", token)
        assert missing.is_error
        calls = wait_for(lambda: len(found := [s for s in receiver.spans if s["kind"] == SERVER
                                               and s["name"].startswith("tools/call ")]) >= 4 and found,
                         "the calls' spans")
        time.sleep(0.5)  # their children, sent in the same batches or the next
    assert len({span["trace"] for span in calls}) == 4  # one trace per call
    by_trace = {span["trace"]: span for span in calls}
    assert by_trace[AGENT_TRACE]["attributes"]["gen_ai.tool.name"] == "crm__update_deal"  # the agent's trace
    for span in calls:
        attributes = span["attributes"]
        assert attributes["mcp.method.name"] == "tools/call" and span["name"] == f"tools/call "\
            f"{attributes['gen_ai.tool.name']}"
        assert attributes["jsonrpc.request.id"] != "" and attributes["mcp.protocol.version"]
        assert attributes.get("undo.run.id") == str(Run.objects.get(agent__name="sales-bot").public_id)
        assert attributes["undo.policy.decision"] == "allow" and span["service"] == "agent-undo-test"
        family = [s for s in receiver.spans if s["trace"] == span["trace"]]
        [upstream] = [s for s in family if s["kind"] == CLIENT and s["name"].startswith("tools/call ")]
        assert upstream["parent"] == span["id"]  # the upstream call is the agent's call's child
        children = {s["name"] for s in family if s["parent"] == span["id"]}
        assert children >= {"policy decision", "journal commit"}
        # The tool server had the trace context, in the request's headers and in its `_meta`.
        name = attributes["gen_ai.tool.name"].split("__")[1]
        sent = [(h, b) for h, b in seen.tool_calls(name) if span["trace"] in h.get("traceparent", "")]
        [(headers, body)] = sent
        # The upstream call's span, or the `mcp` SDK client's own span inside it (the SDK's path).
        below = {s["id"] for s in family if s["parent"] == upstream["id"]}
        assert headers["traceparent"].split("-")[2] in {upstream["id"], *below}
        assert body["params"]["_meta"]["traceparent"] == headers["traceparent"]
    [failed] = [s for s in calls if s["attributes"]["undo.outcome"] == "tool_error"]
    assert failed["attributes"]["error.type"] == "tool_error" and failed["error"]
    [legacy] = [s for s in calls if "mcp.session.id" in s["attributes"]]
    assert legacy["attributes"]["mcp.protocol.version"].startswith("2025-")


def test_a_plan_is_one_trace_from_its_request_through_checks_and_signatures_to_each_compensation(
        receiver, seen_samples, dana, on_call, approver_user, second_approver, tmp_path):
    samples, seen = seen_samples
    register_samples(samples, names=("crm", "calendar"))
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    env = {**worker_env_for_test_database(), **receiver.env()}
    with recorders(env, workers=1) as base:
        anyio.run(agent_calls, f"{base}/mcp/", token)
    run = Run.objects.get(agent__name="sales-bot")
    with running_worker(env, "traced"):
        asked = subprocess.run([sys.executable, "-m", "tests.operations.plan_in_a_process", str(run.pk)],
                               env=env, capture_output=True, text=True, timeout=120)
        assert asked.returncode == 0, asked.stderr[-3000:]
        plan = Plan.objects.get(public_id=asked.stdout.strip())
        wait_for(lambda: Plan.objects.filter(pk=plan.pk, state="completed").exists(), "the plan's execution")
        spans = wait_for(lambda: (found := [s for s in receiver.spans
                                            if s["attributes"].get("undo.plan.id") == str(plan.public_id)
                                            or s["name"].startswith(("compensate ", "check "))])
                         and any(s["name"] == "plan execution" for s in found) and found, "the plan's spans")
        time.sleep(0.5)
    plan.refresh_from_db()
    trace_id = plan.trace_context.split("-")[1]
    spans = [s for s in receiver.spans if s["trace"] == trace_id]
    names = sorted(s["name"] for s in spans if not s["name"].startswith(("SELECT", "INSERT", "UPDATE")))
    assert {"plan requested", "plan draft", "plan checks", "plan execution"} <= set(names)
    assert names.count("plan signature") == 2
    assert [n for n in names if n.startswith("check ")] == ["check hatp_compensate"]  # the undo it checks
    [compensation] = [s for s in spans if s["name"].startswith("compensate ")]
    assert compensation["attributes"]["undo.outcome"] == "compensated"
    # The compensation's request reached the tool server with the plan's trace.
    [(headers, body)] = seen.tool_calls("hatp_compensate")
    assert headers["traceparent"].split("-")[1] == trace_id
