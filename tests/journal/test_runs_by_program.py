"""Issue 43, agents as they really run: clients on the stateless 2026 protocol (the OpenAI Agents SDK, the
Vercel AI SDK) have no session, and the idle rule merged their calls: five processes over 25 minutes were
one run of 14 steps, so "undo from step 1" would undo unrelated work. Runs follow what the client tells
apart: the runId it sends, else the client program it names on every request."""

import json

import pytest

from journal import services
from journal.models import Run

from .helpers import post_stateless_call, register_samples

pytestmark = pytest.mark.django_db(transaction=True)


def deal_call(recorder, token: str, program: dict | None, run_id: str = "", header: str = "") -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            **({"io.modelcontextprotocol/clientInfo": program} if program else {}),
            **({"hatp/journal": {"runId": run_id}} if run_id else {})}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "crm__get_deal", "arguments": {"deal_id": "D-881"}, "_meta": meta}}
    more = {"hatp-run-id": header} if header else {}
    answer = post_stateless_call(recorder, token, "crm__get_deal", json.dumps(body), **more)
    assert answer.status_code == 200 and not answer.json()["result"].get("isError"), answer.text


def test_two_client_programs_of_one_agent_are_two_runs_and_a_run_id_is_its_own(recorder, sample_servers,
                                                                                 dana):
    register_samples(sample_servers, names=("crm",))
    token = services.create_agent(name="desk-bot", on_behalf_of=dana)[1]
    openai = {"name": "openai-agents", "version": "0.24.0"}
    vercel = {"name": "ai-sdk-mcp-client", "version": "7.0.0"}
    for program in (openai, vercel, openai, vercel):
        deal_call(recorder, token, program)
    deal_call(recorder, token, openai, run_id="renewal-42")
    deal_call(recorder, token, None)
    runs = {run.key: run.steps.count() for run in Run.objects.all()}
    assert len(runs) == 4, runs
    assert sorted(count for key, count in runs.items() if key.startswith("idle:")) == [2, 2]
    assert runs["run:renewal-42"] == 1
    assert runs[""] == 1  # a client that names no program: the idle rule as before
    # A run the idle rule made per program can still be ended by a person, like any idle-rule run.
    idle = Run.objects.filter(key__startswith="idle:").order_by("started_at").first()  # openai's
    services.end_run(run_id=idle.pk, by="olivia", now=idle.last_activity_at)
    deal_call(recorder, token, openai)
    assert Run.objects.filter(key__startswith="idle:").count() == 3


def test_the_run_page_says_when_a_run_mixes_client_programs(recorder, sample_servers, dana, on_call, client):
    """Two programs that send the same runId share a run: each call's entry names its client program, and
    the run's page says the run mixes them (undoing from a step would undo both programs' later calls)."""
    register_samples(sample_servers, names=("crm",))
    token = services.create_agent(name="desk-bot", on_behalf_of=dana)[1]
    openai = {"name": "openai-agents", "version": "0.24.0"}
    deal_call(recorder, token, openai, run_id="shared")
    deal_call(recorder, token, openai, run_id="alone")
    deal_call(recorder, token, {"name": "ai-sdk-mcp-client", "version": "7.0.0"}, run_id="shared")
    shared, alone = Run.objects.get(key="run:shared"), Run.objects.get(key="run:alone")
    assert [entry.data["client"] for entry in shared.entries.filter(event="call").order_by("seq")] == [
        "openai-agents 0.24.0", "ai-sdk-mcp-client 7.0.0"]
    assert services.verify_run(run=shared).ok
    client.force_login(on_call)
    page = client.get(f"/runs/{shared.public_id}/").content.decode()
    assert 'id="mixed-programs"' in page and "mixes calls from 2 client programs" in page
    assert "ai-sdk-mcp-client 7.0.0, openai-agents 0.24.0" in page
    assert 'id="mixed-programs"' not in client.get(f"/runs/{alone.public_id}/").content.decode()


def test_a_run_id_header_names_the_run_of_a_framework_that_sends_no_meta_and_a_meta_run_id_wins(
        recorder, sample_servers, dana):
    """The Vercel AI SDK, LlamaIndex and AutoGen send no `_meta` of the agent's: they name a run with the
    `Hatp-Run-Id` header (tests/journal/test_frameworks.py drives each). A runId in `_meta` wins over it."""
    register_samples(sample_servers, names=("crm",))
    token = services.create_agent(name="desk-bot", on_behalf_of=dana)[1]
    vercel = {"name": "ai-sdk-mcp-client", "version": "1.0.0"}
    deal_call(recorder, token, vercel, header="task-a")
    deal_call(recorder, token, vercel, header="task-b")
    deal_call(recorder, token, vercel, header="task-a")
    deal_call(recorder, token, vercel, run_id="from-meta", header="task-a")
    deal_call(recorder, token, vercel)  # no runId: the idle rule per program
    runs = {run.key: run.steps.count() for run in Run.objects.all()}
    assert runs.pop("run:task-a") == 2 and runs.pop("run:task-b") == 1 and runs.pop("run:from-meta") == 1
    assert [key[:5] for key in runs] == ["idle:"], runs
