"""End to end: a real MCP client calls through the Recorder to the real sample servers."""

import io

import anyio
import pytest
from django.core.management import CommandError, call_command
from mcp import MCPError

from journal import services
from journal.models import ChainEntry, Checkpoint, Run, Step, StepDependency
from journal.record import chain, keys

from .helpers import agent_client, register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent_token(dana):
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)
    return token


def test_tools_list_is_the_namespaced_union_without_the_undo_tools(recorder, sample_servers, agent_token):
    register_samples(sample_servers)

    async def script(client):
        return await client.list_tools()

    names = {tool.name for tool in run_agent(recorder, agent_token, script).tools}
    assert {"crm__update_deal", "crm__get_deal", "calendar__create_event", "mail__send_email",
            "payments__charge_payment", "payments__refund_payment", "inventory__reserve_inventory",
            "legacy__create_ticket"} <= names
    assert not any(name.endswith(("hatp_check", "hatp_compensate")) for name in names)


def test_globex_story_is_journaled_with_the_right_undo_facts(recorder, sample_servers, agent_token):
    register_samples(sample_servers)

    async def script(client):
        meta = {"hatp/journal": {"runId": "globex-1"}}
        deal = await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}, meta=meta)
        event = await client.call_tool("calendar__create_event", {
            "title": "Kickoff with Globex", "start": "2026-12-04T15:00:00+00:00",
            "attendees": ["dana@acme.example", "buyer@globex.example"]}, meta=meta)
        mail = await client.call_tool(
            "mail__send_email",
            {"to": "buyer@globex.example", "subject": "Welcome aboard", "body": "See you on the 4th"},
            meta=meta,
        )
        return deal, event, mail

    deal, event, mail = run_agent(recorder, agent_token, script)
    # The agent gets the tool server's result unchanged, _meta and all.
    assert deal.meta["hatp/journal"]["effect"]["summary"] == "Deal D-881 stage: Proposal → Won"
    assert not deal.is_error and not event.is_error and not mail.is_error

    run = Run.objects.get(key="run:globex-1")
    steps = list(run.steps.order_by("number"))
    assert [s.namespaced_tool for s in steps] == [
        "crm__update_deal",
        "calendar__create_event",
        "mail__send_email",
    ]

    crm, calendar, email = steps
    assert (crm.reversibility, crm.declaration_source, crm.undo_problems) == (
        "compensate",
        "hatp/journal (call)",
        [],
    )
    assert crm.effect_version == "v13" and crm.effect_resource == "crm://acme/deal/D-881"
    assert crm.compensation_arguments == {"compensationToken": crm.compensation_token}
    assert crm.receipt_verified is True
    assert crm.undo_by is not None and crm.badge == ("reversible", "Reversible via the API")
    assert calendar.declaration["side_effect"] == "attendees get a cancellation notice"
    assert calendar.reversibility == "compensate" and calendar.receipt_verified is True
    assert email.reversibility == "none"
    assert email.declaration["remedy"] == "send a correction email"
    assert (run.reversible_count, run.irreversible_count, run.unknown_count) == (2, 1, 0)
    assert all(s.duration_ms > 0 and s.result is not None for s in steps)

    # The chain holds an intent and an outcome per call, and verifies.
    events = list(ChainEntry.objects.filter(run=run).values_list("event", flat=True))
    assert events == ["run"] + ["call", "result"] * 3
    services.checkpoint_run(run=run)
    verdict = chain.verify(
        run=str(run.public_id),
        entries=[e.as_wire() for e in run.entries.order_by("seq")],
        checkpoints=[c.as_wire() for c in run.checkpoints.all()],
        public_keys=keys.public_keys(),
    )
    assert verdict.ok, str(verdict)
    assert Checkpoint.objects.filter(run=run).count() == 1

    # The server's own ledger agrees with what was journaled.
    assert [e["op"] for e in sample_servers.ledger("crm")] == ["update_deal"]
    assert [e["op"] for e in sample_servers.ledger("mail")] == ["send_email"]


def test_sep3172_and_chronomcp_bindings_resolve_and_links_are_inferred(recorder, sample_servers, agent_token):
    register_samples(sample_servers)

    async def script(client):
        meta = {"hatp/journal": {"runId": "bindings"}}
        charge = await client.call_tool(
            "payments__charge_payment", {"customer": "globex", "amount": "2500.00"}, meta=meta
        )
        hold = await client.call_tool(
            "inventory__reserve_inventory", {"sku": "SKU-GLOBEX-KIT", "quantity": 3}, meta=meta
        )
        # The agent reuses the transaction id in a later call: the Recorder should link the two.
        await client.call_tool("legacy__echo", {"note": charge.structured_content["transactionId"]},
                               meta={"hatp/journal": {"runId": "bindings", "dependsOn": [2]}})
        return charge, hold

    charge, hold = run_agent(recorder, agent_token, script)
    payment, reservation, echo = Step.objects.filter(run__key="run:bindings").order_by("number")
    assert payment.declaration_source == "annotations.recovery"
    assert payment.compensation_arguments == {"transactionId": charge.structured_content["transactionId"]}
    assert reservation.declaration_source == "dev.chronomcp/compensate"
    assert reservation.compensation_arguments == {"id": hold.structured_content["id"]}
    # Neither dialect reports a version, so neither can be undone without a human deciding.
    assert any("no version" in p for p in payment.undo_problems)
    assert echo.reversibility == "unknown" and echo.declaration_source == "none"

    links = {(d.depends_on.number, d.rule): d.pointers for d in StepDependency.objects.filter(step=echo)}
    assert links[(1, "inferred")] == [{"from": "/structuredContent/transactionId", "to": "/note"}]
    assert (2, "declared") in links


def test_upstream_failures_reach_the_agent_faithfully_and_are_classified(
    recorder, sample_servers, agent_token
):
    servers = register_samples(sample_servers, names=("crm", "legacy"))
    services.register_tool_server(name="gone", url="http://127.0.0.1:9/mcp")
    dead = servers["legacy"]
    dead.catalogue = dead.catalogue  # keep its catalogue, then point it at a closed port
    dead.url = "http://127.0.0.1:9/mcp"
    dead.save()

    async def script(client):
        meta = {"hatp/journal": {"runId": "failures"}}
        not_found = await client.call_tool("crm__get_deal", {"deal_id": "D-999"}, meta=meta)
        refused = await client.call_tool("legacy__create_ticket", {"title": "x"}, meta=meta)
        return not_found, refused

    not_found, refused = run_agent(recorder, agent_token, script)
    assert not_found.is_error and "not found" in not_found.content[0].text
    assert refused.is_error and "refused the connection" in refused.content[0].text

    first, second = Step.objects.filter(run__key="run:failures").order_by("number")
    assert (first.status, first.failure_class) == ("error", "not_found")
    assert (second.status, second.failure_class) == ("error", "transient")
    assert Run.objects.get(key="run:failures").failed_count == 2


def test_json_rpc_errors_from_the_server_go_back_as_json_rpc_errors(recorder, sample_servers, agent_token):
    register_samples(sample_servers, names=("crm",))

    sample_servers.set_mode("crm", "rpc_error")

    async def script(client):
        with pytest.raises(MCPError) as failure:
            await client.call_tool("crm__get_deal", {"deal_id": "D-881"})
        assert failure.value.error.code == -32602
        return await client.call_tool("nowhere__tool", {})

    unknown_server = run_agent(recorder, agent_token, script)
    assert unknown_server.is_error and "Unknown tool server" in unknown_server.content[0].text
    step = Step.objects.get()
    assert (step.status, step.failure_class) == ("error", "invalid_arguments")


@pytest.mark.parametrize(("mode", "failure_class", "words"), [
    ("error_5xx", "transient", "HTTP 502"),
    ("garbage", "unknown", "not valid MCP"),
    ("lie", "unknown", "not a valid MCP result"),
])
def test_a_server_that_answers_5xx_or_garbage_is_a_classified_tool_error(
    recorder, sample_servers, agent_token, mode, failure_class, words
):
    register_samples(sample_servers, names=("crm",))

    async def script(client):
        await client.call_tool("crm__get_deal", {"deal_id": "D-881"})  # a healthy session first
        sample_servers.set_mode("crm", mode)
        return await client.call_tool("crm__get_deal", {"deal_id": "D-881"})

    result = run_agent(recorder, agent_token, script)
    assert result.is_error and words in result.content[0].text
    step = Step.objects.get(number=2)
    assert (step.status, step.failure_class) == ("error", failure_class)
    # Whatever the server sent, the record is intact and nothing crashed.
    services.checkpoint_run(run=step.run)
    assert services.verify_run(run=step.run).ok


def test_a_server_that_cannot_be_reached_in_time_did_not_act(recorder, sample_servers, agent_token):
    register_samples(sample_servers, names=("crm",))
    recorder.app.recorder.upstreams.timeout = 1.0
    sample_servers.set_mode("crm", "hang")

    async def script(client):
        return await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})

    result = run_agent(recorder, agent_token, script)
    assert result.is_error and "did not accept a connection in time" in result.content[0].text
    step = Step.objects.get()
    assert (step.failure_class, step.reversibility) == ("transient", "compensate")
    assert Run.objects.get().unknown_count == 0


def test_a_server_that_never_answers_times_out_and_may_have_acted(
    recorder, sample_servers, agent_token, settings
):
    register_samples(sample_servers, names=("crm",))
    recorder.app.recorder.upstreams.timeout = 1.0

    async def script(client):
        await client.call_tool("crm__get_deal", {"deal_id": "D-881"})
        sample_servers.set_mode("crm", "hang")
        return await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})

    result = run_agent(recorder, agent_token, script)
    assert result.is_error and "did not answer in time" in result.content[0].text
    assert "do not repeat" in result.content[0].text
    step = Step.objects.get(number=2)
    assert (step.status, step.failure_class, step.reversibility) == ("error", "transient", "unknown")
    assert Run.objects.get().unknown_count == 1


def test_the_undo_contract_tools_are_refused_to_agents(recorder, sample_servers, agent_token):
    register_samples(sample_servers, names=("crm",))

    async def script(client):
        return await client.call_tool("crm__hatp_compensate", {"compensationToken": "ctk_x"})

    result = run_agent(recorder, agent_token, script)
    assert result.is_error and "reserved" in result.content[0].text
    assert not [e for e in sample_servers.ledger("crm") if e["op"] == "compensate"]
    assert Step.objects.count() == 0


def test_malformed_requests_from_an_agent_get_json_rpc_errors_not_crashes(recorder, agent_token):
    import httpx

    headers = {"Authorization": f"Bearer {agent_token}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    for body in (b"{not json", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": 5}'):
        response = httpx.post(f"{recorder.base}/mcp/", content=body, headers=headers)
        assert response.status_code < 500, (body, response.status_code, response.text)
    assert Step.objects.count() == 0


def test_a_missing_or_wrong_token_is_refused_before_anything_happens(recorder, sample_servers, agent_token):
    import httpx

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer agt_wrong"}, {"Authorization": agent_token}):
        response = httpx.post(f"{recorder.base}/mcp/", json=body, headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_legacy_handshake_clients_get_a_run_per_session(recorder, sample_servers, agent_token):
    register_samples(sample_servers, names=("legacy",))

    async def script(client):
        await client.call_tool("legacy__echo", {"n": 1})
        await client.call_tool("legacy__echo", {"n": 2})

    run_agent(recorder, agent_token, script, mode="legacy")
    run_agent(recorder, agent_token, script, mode="legacy")
    runs = list(Run.objects.all())
    assert len(runs) == 2 and all(r.key.startswith("session:") and r.step_count == 2 for r in runs)


def test_an_agent_whose_framework_opens_a_session_per_call_may_have_its_runs_go_by_the_idle_gap(
        recorder, sample_servers, dana):
    """Issue 24, 8: langchain-mcp-adapters and LlamaIndex open a session per tool call, so each call was a
    run of its own and "undo from step 1" covered one call. An admin may say such an agent's runs go by the
    idle gap across sessions; its runId, when it sends one, still wins."""
    register_samples(sample_servers, names=("legacy",))
    _, token = services.create_agent(name="chain-bot", on_behalf_of=dana, runs_by="idle")

    async def one_call(client):
        await client.call_tool("legacy__echo", {"n": 1})

    async def with_run_id(client):
        await client.call_tool("legacy__echo", {"n": 2}, meta={"hatp/journal": {"runId": "nightly"}})

    for _ in range(3):
        run_agent(recorder, token, one_call, mode="legacy")  # a session per call, as those frameworks do
    run_agent(recorder, token, with_run_id, mode="legacy")
    runs = {run.key: run.step_count for run in Run.objects.all()}
    assert runs == {"": 3, "run:nightly": 1}


def test_an_agent_whose_runs_go_by_its_run_id_only_is_never_merged_by_a_session_or_the_idle_gap(
        recorder, sample_servers, dana):
    """Issue 24, 8: the third choice. Calls with the same runId form one run across sessions; a call
    without one is a run of its own, even in the same session as another."""
    register_samples(sample_servers, names=("legacy",))
    _, token = services.create_agent(name="id-bot", on_behalf_of=dana, runs_by="run_id")

    async def two_calls(client):
        await client.call_tool("legacy__echo", {"n": 1}, meta={"hatp/journal": {"runId": "nightly"}})
        await client.call_tool("legacy__echo", {"n": 2})
        await client.call_tool("legacy__echo", {"n": 3})

    for mode in ("legacy", "auto"):  # a session, then the stateless 2026-07-28 protocol
        run_agent(recorder, token, two_calls, mode=mode)
    runs = sorted((run.key.split(":")[0], run.step_count) for run in Run.objects.all())
    assert runs == [("call", 1)] * 4 + [("run", 2)]


def test_third_party_stdio_servers_work_through_the_recorder_and_their_writes_are_unknown(
    recorder, agent_token, tmp_path
):
    import subprocess
    import sys

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.txt").write_text("kickoff agenda")
    git = services.refresh_catalogue(server=services.register_tool_server(
        name="git", command=f"{sys.executable} -m mcp_server_git --repository {repo}"))
    clock = services.refresh_catalogue(server=services.register_tool_server(
        name="clock", command=f"{sys.executable} -m mcp_server_time --local-timezone UTC"))
    assert "git_add" in git.tool_names and "get_current_time" in clock.tool_names

    async def script(client):
        meta = {"hatp/journal": {"runId": "third-party"}}
        added = await client.call_tool(
            "git__git_add", {"repo_path": str(repo), "files": ["notes.txt"]}, meta=meta
        )
        status = await client.call_tool("git__git_status", {"repo_path": str(repo)}, meta=meta)
        now = await client.call_tool("clock__get_current_time", {"timezone": "Europe/Paris"}, meta=meta)
        return added, status, now

    added, status, now = run_agent(recorder, agent_token, script)
    assert added.content[0].text == "Files staged successfully"
    assert "new file:   notes.txt" in status.content[0].text
    assert now.structured_content["timezone"] == "Europe/Paris"
    git_add, git_status, clock_now = Step.objects.filter(run__key="run:third-party").order_by("number")
    # Nothing declares an undo for git_add: unknown, never safe. Reads say so with readOnlyHint.
    assert (git_add.reversibility, git_add.declaration_source) == ("unknown", "none")
    assert (git_status.reversibility, git_status.declaration_source) == (
        "read_only",
        "annotations.readOnlyHint",
    )
    assert clock_now.reversibility == "read_only" and clock_now.status == "ok"
    assert Run.objects.get(key="run:third-party").unknown_count == 1


def test_the_recorder_key_exists_from_the_first_start(recorder, settings):
    from journal.models import RecorderKey

    key = RecorderKey.objects.get(origin="")
    assert (settings.RECORDER_KEY_DIR / f"{key.key_id}.ed25519").exists()


def _story(client_meta):
    async def script(client):
        results = []
        for name, arguments in [
            ("crm__get_deal", {"deal_id": "D-882"}),
            ("crm__update_deal", {"deal_id": "D-882", "stage": "Won"}),
            ("crm__get_deal", {"deal_id": "D-404"}),
            ("nowhere__tool", {}),
            ("crm__hatp_check", {}),
        ]:
            result = await client.call_tool(name, arguments, meta=client_meta)
            results.append(result.model_dump(exclude={"meta"}))
        return results

    return script


def test_the_fast_path_answers_plain_calls_exactly_as_the_sdk_would(sample_servers, agent_token, settings):
    from approver.asgi import build_application
    from tests.conftest import ServerThread, free_port

    register_samples(sample_servers, names=("crm",))
    answers = {}
    for fast in (True, False):
        settings.RECORDER_FAST_CALLS = fast
        application = build_application()
        with ServerThread(application, free_port()) as recorder:
            answers[fast] = run_agent(
                recorder, agent_token, _story({"hatp/journal": {"runId": f"fast-{fast}"}})
            )
            if fast:
                assert application.fast_calls.answered == 5
            else:
                assert application.fast_calls is None
        sample_servers.colleague_update("D-882", {"stage": "Qualification"}, by="reset")
    # Same answers either way, token and version aside (each run changed the deal once).
    for fast_answer, sdk_answer in zip(answers[True], answers[False], strict=True):
        assert fast_answer["is_error"] == sdk_answer["is_error"]
        assert fast_answer["structured_content"] is None or set(fast_answer["structured_content"]) == set(
            sdk_answer["structured_content"])
        assert [c["text"].split(" v")[0] for c in fast_answer["content"]] == [
            c["text"].split(" v")[0] for c in sdk_answer["content"]]
    fast_steps = Step.objects.filter(run__key="run:fast-True").order_by("number")
    sdk_steps = Step.objects.filter(run__key="run:fast-False").order_by("number")
    assert [(s.tool, s.status, s.reversibility, s.failure_class) for s in fast_steps] == [
        (s.tool, s.status, s.reversibility, s.failure_class) for s in sdk_steps]


def test_unusual_requests_fall_back_to_the_sdk(recorder, sample_servers, agent_token):
    import httpx

    register_samples(sample_servers, names=("crm",))
    headers = {
        "Authorization": f"Bearer {agent_token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Mcp-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "crm__get_deal",
    }
    envelope = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}}
    plain = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
             "params": {"name": "crm__get_deal", "arguments": {"deal_id": "D-881"}, "_meta": envelope}}
    response = httpx.post(f"{recorder.base}/mcp/", json=plain, headers=headers)
    assert response.status_code == 200 and response.json()["result"]["structuredContent"]["id"] == "D-881"
    assert recorder.app.fast_calls.answered == 1

    # The Mcp-Name header disagrees with the body: the SDK refuses it, as it always would.
    mismatch = httpx.post(
        f"{recorder.base}/mcp/", json=plain, headers={**headers, "Mcp-Name": "crm__update_deal"}
    )
    assert mismatch.status_code == 400 and "error" in mismatch.json()
    # A request from a page on another origin is refused by the SDK's origin check.
    foreign = httpx.post(f"{recorder.base}/mcp/", json=plain, headers={**headers, "Origin": "https://evil.example"})
    assert foreign.status_code == 403
    assert recorder.app.fast_calls.answered == 1
    assert Step.objects.count() == 1


@pytest.mark.parametrize("fast", [True, False])
def test_when_the_intent_cannot_be_journaled_nothing_is_forwarded(
    sample_servers, agent_token, settings, monkeypatch, fast
):
    from approver.asgi import build_application
    from tests.conftest import ServerThread, free_port

    register_samples(sample_servers, names=("crm",))
    settings.RECORDER_FAST_CALLS = fast

    def broken(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(services, "open_step", broken)

    async def script(client):
        with pytest.raises(MCPError) as failure:
            await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})
        return failure.value.error

    with ServerThread(build_application(), free_port()) as recorder:
        error = run_agent(recorder, agent_token, script)
    assert error.code == -32603 and "database" not in error.message  # no internals on the wire
    assert sample_servers.ledger("crm") == []


@pytest.mark.parametrize("fast", [True, False])
def test_an_outcomes_pure_part_is_worked_out_off_the_journal_thread_or_by_it_when_that_fails(
        sample_servers, agent_token, settings, monkeypatch, fast):
    import threading

    from approver.asgi import build_application
    from tests.conftest import ServerThread, free_port

    register_samples(sample_servers, names=("crm",))
    settings.RECORDER_FAST_CALLS = fast
    prepare_close, close_step = services.prepare_close, services.close_step
    prepared_on, closed_on, fail = [], [], [False, True]

    def watched_prepare_close(**kwargs):
        prepared_on.append(threading.current_thread().name)
        if fail.pop(0):
            raise RuntimeError("a result this code cannot canonicalize")
        return prepare_close(**kwargs)

    def watched_close_step(**kwargs):
        closed_on.append((threading.current_thread().name, kwargs["closing"] is not None))
        return close_step(**kwargs)

    monkeypatch.setattr(services, "prepare_close", watched_prepare_close)
    monkeypatch.setattr(services, "close_step", watched_close_step)
    meta = {"hatp/journal": {"runId": f"prepared-{fast}"}}

    async def script(client):
        for stage in ("Won", "Lost"):
            await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": stage}, meta=meta)

    with ServerThread(build_application(), free_port()) as recorder:
        run_agent(recorder, agent_token, script)
    assert len(prepared_on) == 2 and "recorder-journal" not in prepared_on
    # The second call's preparation failed: the journal thread worked its outcome out itself, all of it.
    assert closed_on == [("recorder-journal", True), ("recorder-journal", False)]
    run = Run.objects.get(key=f"run:prepared-{fast}")
    assert [(s.number, s.status, s.reversibility) for s in run.steps.order_by("number")] == [
        (1, "ok", "compensate"), (2, "ok", "compensate")]
    assert services.verify_run(run=run).ok


def test_the_answer_waits_for_its_outcome_commit_and_the_next_call_comes_after_it(
        sample_servers, agent_token, monkeypatch):
    import time

    from approver.asgi import build_application
    from tests.conftest import ServerThread, free_port

    register_samples(sample_servers, names=("legacy",))
    close_step = services.close_step

    def slow_close_step(**kwargs):
        time.sleep(1.0)  # a database that takes its time to commit
        return close_step(**kwargs)

    monkeypatch.setattr(services, "close_step", slow_close_step)
    meta = {"hatp/journal": {"runId": "slow-db"}}

    async def script(client):
        started = time.monotonic()
        await client.call_tool("legacy__echo", {"text": "one"}, meta=meta)
        first = time.monotonic() - started
        await client.call_tool("legacy__echo", {"text": "two"}, meta=meta)
        return first

    with ServerThread(build_application(), free_port()) as recorder:

        async def main():
            async with agent_client(recorder, agent_token) as client:
                return await script(client)

        first_answer = anyio.run(main)
    # An agent is told of a result only once it is journaled: a Recorder killed a moment later loses nothing
    # it was told (tests/faults/test_killed_recorder.py kills one in the middle of a group).
    assert first_answer >= 1.0
    run = Run.objects.get(key="run:slow-db")
    assert [(s.number, s.status) for s in run.steps.order_by("number")] == [(1, "ok"), (2, "ok")]
    # The first outcome was journaled before the second call's intent: the chain keeps call order.
    assert [(e.event, e.data["step"]) for e in run.entries.order_by("seq") if e.event != "run"] == [
        ("call", 1), ("result", 1), ("call", 2), ("result", 2)]


def test_a_disabled_server_or_a_new_catalogue_counts_from_the_next_call(
    recorder, sample_servers, agent_token
):
    servers = register_samples(sample_servers, names=("legacy",))
    meta = {"hatp/journal": {"runId": "directory"}}

    async def call(client):
        return await client.call_tool("legacy__echo", {"text": "hi"}, meta=meta)

    assert not run_agent(recorder, agent_token, call).is_error
    legacy = servers["legacy"]
    catalogue = [
        {**tool, "annotations": {**(tool.get("annotations") or {}), "readOnlyHint": True}}
        if tool["name"] == "echo" else tool for tool in legacy.catalogue
    ]
    services.save_catalogue(server=legacy, tools=catalogue)
    run_agent(recorder, agent_token, call)
    legacy.enabled = False
    legacy.save()
    refused = run_agent(recorder, agent_token, call)
    assert refused.is_error and "Unknown tool server 'legacy'" in refused.content[0].text
    steps = Run.objects.get(key="run:directory").steps.order_by("number")
    assert [s.reversibility for s in steps] == ["unknown", "read_only"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_agent_may_have_the_advice_on_a_failed_call_in_its_content_too(recorder, sample_servers, dana,
                                                                          mode):
    """Issue 24, 9: LangChain's ToolMessage and pydantic-ai's tool return drop `_meta`, so the advice never
    reached the model. Opted in per agent, it is one short text block at the end; off, nothing is added."""
    register_samples(sample_servers, names=("crm",))
    plain, plain_token = services.create_agent(name="plain-bot", on_behalf_of=dana)
    told, told_token = services.create_agent(name="told-bot", on_behalf_of=dana, advice_in_content=True)

    async def script(client):
        return (await client.call_tool("crm__get_deal", {"deal_id": "D-999"}),  # the server's own error
                await client.call_tool("nowhere__x", {}),  # the Recorder's
                await client.call_tool("crm__get_deal", {"deal_id": "D-881"}))  # no failure, nothing added

    for token, added in ((plain_token, False), (told_token, True)):
        missing, unknown, found = run_agent(recorder, token, script, mode=mode)
        for failed in (missing, unknown):
            texts = [block.text for block in failed.content]
            assert texts[-1].startswith("[Recorder advice] ") is added, texts
            assert failed.meta["hatp/journal"]["recovery"]["action"]  # the advice stays in `_meta` too
        assert not any(block.text.startswith("[Recorder advice]") for block in found.content)
    assert missing.content[-1].text.startswith("[Recorder advice] Fix the arguments: ")
    assert unknown.content[-1].text.startswith("[Recorder advice] Fix the arguments: ")


def test_a_server_moved_to_an_address_that_cannot_be_read_offers_no_tools_and_says_why(
        recorder, sample_servers, agent_token):
    """Issue 24, 7: after `add_tool_server … --update` to a URL whose catalogue cannot be read, the old
    address's tools were still offered."""
    register_samples(sample_servers, names=("crm",))
    out, err = io.StringIO(), io.StringIO()
    # Issue 44, finding 11: it exited 0; a script that registers servers must hear that this one failed.
    with pytest.raises(CommandError, match="crm is registered, but its tools could not be read"):
        call_command("add_tool_server", "crm", "http://127.0.0.1:9/mcp", update=True, stdout=out, stderr=err)
    assert "crm: 0 tools" in out.getvalue()
    assert "No tools are offered until its catalogue is read." in err.getvalue()

    async def script(client):
        return [tool.name for tool in (await client.list_tools()).tools]

    assert not any(name.startswith("crm__") for name in run_agent(recorder, agent_token, script))
