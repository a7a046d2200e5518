"""A failed call under a saga policy stops the run (ChronoMCP's saga mode), through the Recorder and the
sample
servers: "propose" opens the plan that undoes the task and tells the agent where it is; "unwind" runs that
plan
before the agent hears of its failure when no human is needed, and falls back to "propose" otherwise; the run
refuses further calls until the plan ends or a person releases it. The servers' ledgers say what happened."""

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client as WebClient
from django.utils import timezone

from approver import policy, services, tasks
from approver.models import AutonomyPolicy, Plan
from journal import services as journal_services
from journal.models import Run
from tests.journal.helpers import register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)

ALLOW_ALL = dict.fromkeys(policy.CLASSES, "allow")
MISSING = ("crm__update_deal", {"deal_id": "D-404", "stage": "Won"})  # the CRM answers NOT_FOUND (isError)


@pytest.fixture
def bot(recorder, sample_servers, dana, monkeypatch):
    for task in (tasks.check_plan, tasks.execute_plan, tasks.draft_plan, tasks.notify_plan_ready):
        monkeypatch.setattr(task, "delay", lambda *args: None)
    register_samples(sample_servers, names=("crm", "calendar", "mail"))
    return journal_services.create_agent(name="sales-bot", on_behalf_of=dana)[1]


def saga_policy(admin, on_failure, **fields):
    return services.save_policy(row=AutonomyPolicy(name="Saga", scope="everything", decisions=ALLOW_ALL,
                                                   on_failure=on_failure, **fields), by=admin)


def calls(recorder, token, story, *, run_id="task-1", start=None):
    """The agent's calls in one run; `start` is the index of the call it marks as its task's start."""
    async def script(client):
        results = []
        for index, (name, arguments) in enumerate(story):
            journal = {"runId": run_id, **({"sagaStart": True} if index == start else {})}
            result = await client.call_tool(name, arguments, meta={"hatp/journal": journal})
            results.append(result.model_dump(by_alias=True, mode="json", exclude_none=True))
        return results

    return run_agent(recorder, token, script)


def journal_of(result) -> dict:
    return result["_meta"]["hatp/journal"]


def compensations(sample_servers, name):
    return [e for e in sample_servers.ledger(name) if e["op"] == "compensate"]


def test_propose_opens_the_plan_tells_the_agent_and_halts_the_run_until_released(
        recorder, bot, sample_servers, admin_user, dana, on_call):
    saga_policy(admin_user, "propose")
    results = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}), MISSING])
    failed = results[1]
    assert failed["isError"] and failed["structuredContent"]["code"] == "NOT_FOUND"
    plan = Plan.objects.get()
    assert journal_of(failed)["undoPlan"].endswith(f"/plans/{plan.public_id}/")
    assert journal_of(failed)["recovery"]["action"] == "repair_arguments" and "unwound" not in journal_of(
        failed
    )
    assert plan.requested_by == dana and plan.from_step == 1 and plan.state == "checking"
    assert "step 2 (crm__update_deal) failed" in plan.reason
    run = Run.objects.get()
    assert run.halted_by_plan == str(plan.public_id)

    # The next call in the run is refused, and never reaches the CRM.
    refused = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-882", "stage": "Won"})])[0]
    assert refused["isError"] and "This run is halted" in refused["content"][0]["text"]
    assert str(plan.public_id) in refused["content"][0]["text"]
    assert [e["deal"] for e in sample_servers.ledger("crm") if e["op"] == "update_deal"] == ["D-881"]

    # On-call releases the run from its page (only by POST, with the token); its calls go through again.
    web = WebClient(enforce_csrf_checks=True)
    web.force_login(on_call)
    page = web.get(f"/runs/{run.public_id}/").content.decode()
    assert "Halted." in page and "Release the run" in page
    assert web.post(f"/runs/{run.public_id}/release/").status_code == 403
    web.post(f"/runs/{run.public_id}/release/", HTTP_X_CSRFTOKEN=web.cookies["csrftoken"].value)
    again = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-882", "stage": "Won"})])[0]
    assert not again.get("isError")
    events = list(run.entries.order_by("seq").values_list("event", flat=True))
    assert events.index("saga") < events.index("plan") < events.index("halted") < events.index("released")
    assert run.entries.get(event="released").data["by"] == "olivia"
    assert journal_services.verify_run(run=run).ok


def test_unwind_runs_the_plan_before_the_agent_hears_of_its_failure(
    recorder, bot, sample_servers, admin_user
):
    saga_policy(admin_user, "unwind", auto_run_plans=True)
    story = [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}),
             ("crm__update_deal", {"deal_id": "D-882", "amount": "15000"}), MISSING]
    failed = calls(recorder, bot, story)[2]
    unwound = journal_of(failed)["unwound"]
    assert unwound["state"] == "completed" and unwound["notReversed"] == []
    assert [r["step"] for r in unwound["reversed"]] == [2, 1]  # most recent first
    assert [c["resource"] for c in compensations(sample_servers, "crm")] == ["deal/D-882", "deal/D-881"]
    plan = Plan.objects.get()
    assert plan.approved_by_policy and journal_of(failed)["undoPlan"].endswith(f"/plans/{plan.public_id}/")

    # The plan has ended, so the run's next call goes through (the Recorder releases it, on the record).
    assert not calls(recorder, bot, [("crm__get_deal", {"deal_id": "D-881"})])[0].get("isError")
    run = Run.objects.get(key="run:task-1")
    assert run.halted_by_plan == "" and run.entries.get(event="released").data["by"] == "the Recorder"
    assert run.entries.filter(event="compensation").count() == 3 and journal_services.verify_run(run=run).ok


def test_unwind_falls_back_to_propose_when_a_human_is_needed(recorder, bot, sample_servers, admin_user):
    saga_policy(admin_user, "unwind", auto_run_plans=True)
    story = [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}),
             ("mail__send_email", {"to": "buyer@globex.example", "subject": "Hi", "body": "Won!"}), MISSING]
    failed = calls(recorder, bot, story)[2]
    unwound = journal_of(failed)["unwound"]
    assert unwound["state"] == "ready" and "Step 2 cannot be undone" in unwound["proposed"]
    assert compensations(sample_servers, "crm") == [] and Plan.objects.get().state == "ready"
    assert Run.objects.get(
        key="run:task-1"
    ).halted_by_plan  # it waits for approvers, and the run waits with it


def test_the_plan_starts_where_the_agent_marked_its_task_and_nothing_earlier_is_touched(
        recorder, bot, sample_servers, admin_user):
    saga_policy(admin_user, "unwind", auto_run_plans=True)
    story = [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}),
             ("crm__update_deal", {"deal_id": "D-882", "amount": "15000"}), MISSING]
    failed = calls(recorder, bot, story, start=1)[2]
    assert [r["step"] for r in journal_of(failed)["unwound"]["reversed"]] == [2]
    assert Plan.objects.get().from_step == 2
    assert [c["resource"] for c in compensations(sample_servers, "crm")] == ["deal/D-882"]


def test_an_upstream_json_rpc_error_stays_verbatim_and_still_stops_the_run(
    recorder, bot, sample_servers, admin_user
):
    saga_policy(admin_user, "propose")
    calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})])
    sample_servers.set_mode("crm", "rpc_error")

    async def script(client):
        from mcp import MCPError

        with pytest.raises(MCPError) as raised:
            await client.call_tool(
                "crm__update_deal", {"deal_id": "D-882"}, meta={"hatp/journal": {"runId": "task-1"}}
            )
        return raised.value.error

    error = run_agent(recorder, bot, script)
    assert (error.code, error.data) == (-32602, {"field": "arguments", "tool": "update_deal"})
    assert Run.objects.get().halted_by_plan == str(Plan.objects.get().public_id)


def test_without_a_saga_policy_a_failure_is_just_an_error(recorder, bot, sample_servers, admin_user):
    services.save_policy(
        row=AutonomyPolicy(name="Plain", scope="everything", decisions=ALLOW_ALL), by=admin_user
    )
    failed = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}), MISSING])[1]
    assert "undoPlan" not in journal_of(failed) and not Plan.objects.exists()
    assert not Run.objects.get().halted_by_plan


# Issue 22, finding 14: an agent (or a failing server) opened unlimited plans and approver emails, and a
# halted run was sidestepped with a new runId.

def release_as(on_call, run):
    web = WebClient()
    web.force_login(on_call)
    assert web.post(f"/runs/{run.public_id}/release/").status_code == 302


def test_a_new_run_id_does_not_sidestep_the_halt_the_agent_is_halted_with_its_run(
        recorder, bot, sample_servers, admin_user, on_call):
    saga_policy(admin_user, "propose")
    calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}), MISSING])
    plan = Plan.objects.get()
    elsewhere = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-882", "stage": "Won"})],
                      run_id="task-2")[0]
    assert elsewhere["isError"] and "This agent is halted" in elsewhere["content"][0]["text"]
    assert str(plan.public_id) in elsewhere["content"][0]["text"]
    assert [e["deal"] for e in sample_servers.ledger("crm") if e["op"] == "update_deal"] == ["D-881"]
    # A person looks: releasing the halted run releases the agent, and its calls go through again.
    release_as(on_call, Run.objects.get(key="run:task-1"))
    again = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-882", "stage": "Won"})],
                  run_id="task-2")
    assert not again[0].get("isError")
    assert Run.objects.get(key="run:task-1").entries.get(event="halted").data["agent"] is True


def test_an_agent_has_at_most_so_many_undo_plans_open_after_failed_calls(
        recorder, bot, sample_servers, admin_user, on_call, settings):
    settings.SAGA_OPEN_PLANS_PER_AGENT = 1
    saga_policy(admin_user, "propose")
    calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}), MISSING])
    release_as(on_call, Run.objects.get(key="run:task-1"))  # the plan stays open
    failed = calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-882", "stage": "Won"}), MISSING],
                   run_id="task-2")[1]
    assert journal_of(failed)["undoPlan"] is None
    assert "already has 1 undo plan open after failed calls" in journal_of(failed)["undoRefused"]
    assert Plan.objects.count() == 1
    second = Run.objects.get(key="run:task-2")
    assert second.entries.get(event="saga_refused").data["why"] == journal_of(failed)["undoRefused"]
    assert journal_services.verify_run(run=second).ok


def test_approvers_hear_of_plans_after_failed_calls_in_one_message_per_window(
        recorder, bot, sample_servers, admin_user, on_call, approver_user, second_approver, settings):
    for user in (approver_user, second_approver):
        user.email = f"{user.username}@acme.example"
        user.save()
    saga_policy(admin_user, "propose")
    # Each task changes the deal (a call that changed nothing would leave nothing to sign for).
    for task, stage in (("task-1", "Won"), ("task-2", "Lost"), ("task-3", "Negotiation")):
        calls(recorder, bot, [("crm__update_deal", {"deal_id": "D-881", "stage": stage}), MISSING],
              run_id=task)
        release_as(on_call, Run.objects.get(key=f"run:{task}"))
    plans = list(Plan.objects.order_by("created_at"))
    assert all(plan.saga for plan in plans)

    ready = services.run_checks(plan=plans[0], check_round=plans[0].check_round)
    assert tasks.notify_plan_ready(ready.pk, ready.check_round) == 1  # the first is told at once
    for plan in plans[1:]:
        ready = services.run_checks(plan=plan, check_round=plan.check_round)
        assert ready.state == "ready"
        assert tasks.notify_plan_ready(ready.pk, ready.check_round) == 0  # the next ones wait ...
    assert tasks.notify_saga_plans() == 0
    [first] = mail.outbox
    assert sorted(first.to) == ["ana@acme.example", "bo@acme.example"]
    assert str(plans[0].public_id) in first.body

    Plan.objects.update(ready_notified_at=timezone.now() - timedelta(minutes=settings.SAGA_NOTIFY_MINUTES))
    assert tasks.notify_saga_plans() == 1  # ... for one message, once the window has passed
    assert tasks.notify_saga_plans() == 0
    [_, batch] = mail.outbox
    assert batch.subject == "2 undo plans ready for sign-off after failed calls"
    assert str(plans[1].public_id) in batch.body and str(plans[2].public_id) in batch.body
