"""Issue 43, finding 3: a plan drafted while a call was held said "held and not made" after the call was
approved and sent, also after Check again, and approvers signed that. Plans follow held calls: approving or
denying one, and sending it, draws every plan still open for signing that covers its step again from the
record (approvals of the old content no longer count), and Check again does the same. Through the real
Recorder, judged by the mail server's ledger."""

import anyio
import pytest
from django.test import Client
from django.urls import reverse

from approver import authority, services
from approver.models import ActionRequest, AutonomyPolicy, Plan
from approver.planning import HELD_NOT_MADE
from approver.policy import DEFAULT_DECISIONS
from journal import services as journal_services
from journal.models import Run, Step
from tests.journal.helpers import run_agent

from .test_approvals import approve, enrolled
from .test_executor import ops, run_plan
from .test_held_calls import EMAIL, decide, sales_bot, sent_emails, set_policy

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["sales_bot"]  # a fixture, used by name
WON = {"deal_id": "D-881", "stage": "Won"}


def checked(plan: Plan) -> Plan:
    plan = services.draft_plan(plan=plan)
    return services.run_checks(plan=plan, check_round=plan.check_round) or Plan.objects.get(pk=plan.pk)


def reasons(plan: Plan) -> dict[int, tuple[str, str]]:
    return {item.step.number: (item.action, item.reason) for item in plan.items.select_related("step")}


def test_a_plan_follows_a_held_call_through_its_approval_and_the_call_that_carried_it(
        recorder, sales_bot, sample_servers, admin_user, on_call, approver_user, second_approver, settings):
    """Step 1 marks the deal Won; step 2, an email, is held and the agent told (its own attempt is never
    sent). A plan from step 1 is drafted and checked, and bo signs it. ana approves the email: the plan is
    drafted again. The agent calls again and the email goes out as step 3: drafted again, the plan now
    carries step 3 as what it is (an email cannot be unsent), says where step 2's call went, and bo's
    signature of the old content no longer counts."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 0.5
    _, token = sales_bot
    set_policy(admin_user)
    plans = {}

    def plan_then_approve():
        run = Run.objects.get()
        plan = services.request_plan(run=run, requested_by=on_call, reason="undo", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        assert plan.state == "ready"
        assert reasons(plan)[2] == ("nothing_to_undo", "Held for approval and never sent.")
        approve(plan, second_approver, enrolled(second_approver), choices={})
        plan.refresh_from_db()
        assert plan.state == "ready" and len(authority.counting_approvals(plan=plan)) == 1
        plans["signed"] = plan.digest
        decide(ActionRequest.objects.get(), approver_user, "approve")
        plan.refresh_from_db()
        assert plan.state == "drafting"  # approving the held call sends the plan back to be drafted
        plan = checked(plan)
        assert "approved since, it goes out with the agent's next identical call" in reasons(plan)[2][1]
        plans["plan"] = plan

    async def script(client):
        await client.call_tool("crm__update_deal", WON)
        told = await client.call_tool("mail__send_email", EMAIL)
        await anyio.to_thread.run_sync(plan_then_approve)
        return told, await client.call_tool("mail__send_email", EMAIL)

    told, sent = run_agent(recorder, token, script)
    assert told.is_error and "awaits approval" in told.content[0].text and not sent.is_error
    assert len(sent_emails(sample_servers)) == 1
    plan = Plan.objects.get(pk=plans["plan"].pk)
    assert plan.state == "drafting"  # sending it did the same
    plan = checked(plan)
    now = reasons(plan)
    assert now[3][0] == "cannot_undo" and Step.objects.get(number=3).status == "ok"
    assert now[2] == ("nothing_to_undo", "Held for approval and never sent itself: once approved, the call "
                      "went out with the agent's next identical call, step 3, undone as its own item.")
    assert now[1][0] == "compensate" and plan.state == "ready"
    assert plan.digest != plans["signed"] and authority.counting_approvals(plan=plan) == []
    entries = plan.run.entries.filter(event="plan_redrafted").order_by("seq")
    redrafts = [entry.data["why"] for entry in entries]
    assert redrafts == ["the call held at its step was approved by ana",
                        "the approved call held at its step was sent, as step 3"]


def test_check_again_draws_a_plan_again_once_a_step_it_was_drafted_on_while_held_has_moved_on(
        recorder, sales_bot, sample_servers, admin_user, on_call, approver_user, settings):
    """A plan drafted while the call was still waiting in the agent's request says "held and not made";
    the call is approved and sent in that same request. A plan that missed the moment (drafted, then its
    item left as it was) is drawn again by Check again, and then says what the call was."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 20
    _, token = sales_bot
    set_policy(admin_user)
    box = {}

    def while_held():
        import time

        deadline = time.monotonic() + 15
        while not Step.objects.filter(tool="send_email", status="held").exists():
            assert time.monotonic() < deadline, "the email was never held"
            time.sleep(0.05)
        plan = services.request_plan(run=Run.objects.get(), requested_by=on_call, reason="undo", from_step=1)
        box["plan"] = services.run_checks(plan=plan, check_round=plan.check_round)
        assert reasons(box["plan"])[2] == ("nothing_to_undo", HELD_NOT_MADE)

    async def script(client):
        await client.call_tool("crm__update_deal", WON)
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, while_held)
            result = await client.call_tool("mail__send_email", EMAIL)
        return result

    # The approval is given while the agent waits: its request sends the call itself.
    def approve_when_held():
        import time

        while "plan" not in box:
            time.sleep(0.05)
        decide(ActionRequest.objects.get(), approver_user, "approve")

    import threading

    approver = threading.Thread(target=approve_when_held)
    approver.start()
    result = run_agent(recorder, token, script)
    approver.join(10)
    assert not result.is_error and len(sent_emails(sample_servers)) == 1
    plan = Plan.objects.get(pk=box["plan"].pk)
    assert plan.state == "drafting"
    # As a plan that missed both moments would be: ready, its item still saying "held and not made".
    plan = checked(plan)
    plan.items.filter(step__number=2).update(action="nothing_to_undo", reason=HELD_NOT_MADE)
    client = Client()
    client.force_login(on_call)
    client.post(reverse("approver:check_again", args=[plan.public_id]))
    plan.refresh_from_db()
    assert plan.state == "drafting"
    plan = checked(plan)
    assert reasons(plan)[2][0] == "cannot_undo" and Step.objects.get(number=2).status == "ok"


def test_a_held_change_sent_after_a_plan_was_drafted_is_undone_once_over_a_change_an_approver_overrode(
        recorder, sales_bot, sample_servers, admin_user, on_call, approver_user, second_approver, dana,
        settings):
    """A sequence: sales-bot raises deal D-882's amount (step 1); from then on its changes are asked about,
    and its change of D-881's stage is held and the agent told (step 2). A plan from step 1 is drafted then:
    undo the amount, nothing to undo for the stage. ana approves the stage change, the agent calls again and
    it goes out as step 3; ops-bot then changes D-881's amount. Check again draws the plan afresh: step 3's
    change is to be undone too, in conflict with ops-bot's. Both approvers sign an overwrite, and the worker
    undoes each change once: the CRM's ledger has two compensations, both deals have the stage and amount
    sales-bot found, and ops-bot's amount stays (step 3 did not touch it)."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 0.5
    agent, token = sales_bot
    raised = run_agent(recorder, token, lambda client: client.call_tool(
        "crm__update_deal", {"deal_id": "D-882", "amount": 15000}))
    assert not raised.is_error
    services.save_policy(row=AutonomyPolicy(name="sales-bot asks", scope="agent", agent=agent,
                                            decisions={**DEFAULT_DECISIONS, "compensate_api": "ask"}),
                         by=admin_user)
    told = run_agent(recorder, token, lambda client: client.call_tool("crm__update_deal", WON))
    assert told.is_error and "awaits approval" in told.content[0].text
    run = Run.objects.get(agent=agent)
    plan = checked_request(run, on_call)
    assert reasons(plan) == {1: ("compensate", reasons(plan)[1][1]),
                             2: ("nothing_to_undo", "Held for approval and never sent.")}

    decide(ActionRequest.objects.get(), approver_user, "approve")
    assert Plan.objects.get(pk=plan.pk).state == "drafting"
    sent = run_agent(recorder, token, lambda client: client.call_tool("crm__update_deal", WON))
    assert not sent.is_error and Step.objects.get(run=run, number=3).status == "ok"
    ops_token = journal_services.create_agent(name="ops-bot", on_behalf_of=dana)[1]
    other = run_agent(recorder, ops_token, lambda client: client.call_tool(
        "crm__update_deal", {"deal_id": "D-881", "amount": 52000}))
    assert not other.is_error

    plan = checked(Plan.objects.get(pk=plan.pk))
    now = reasons(plan)
    assert plan.state == "ready" and (now[1][0], now[3][0]) == ("compensate", "compensate"), now
    assert services.conflict_positions(plan) == {plan.items.get(step__number=3).position}
    overwrite = {str(position): "overwrite" for position in services.conflict_positions(plan)}
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices=overwrite)
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    outcomes = {item.step.number: item.outcome for item in plan.items.select_related("step")}
    assert plan.state == "completed" and outcomes[1] == outcomes[3] == "compensated", outcomes
    assert len(ops(sample_servers, "crm")) == 2  # each change undone once

    async def deals(client):
        return [(await client.call_tool("crm__get_deal", {"deal_id": deal})).structured_content
                for deal in ("D-881", "D-882")]

    d881, d882 = run_agent(recorder, ops_token, deals)
    assert (d881["stage"], str(d881["amount"])) == ("Proposal", "52000")
    assert (d882["stage"], str(d882["amount"])) == ("Qualification", "12000")


def checked_request(run, by) -> Plan:
    plan = services.request_plan(run=run, requested_by=by, reason="wrong deal", from_step=1)
    return services.run_checks(plan=plan, check_round=plan.check_round) or Plan.objects.get(pk=plan.pk)
