"""Issue 44, finding 3: where a later step of the same run changed the record again (its undo runs first), the
earlier step was flagged "Since then someone changed it", and approvers who chose to undo it anyway saw it
refused at execution, since the plan's own first undo had moved the record on. Chains of the plan's own
steps are not conflicts, and each undo is sent conditional on the version the plan's own earlier undo left.
Against the sample CRM (a server with its own undo, HATP), whose ledger says what really happened."""

import pytest

from approver import services
from approver.models import Plan
from journal.models import Run
from tests.journal.helpers import run_agent

from .test_approvals import approve, enrolled
from .test_executor import ops, run_plan
from .test_held_calls import sales_bot

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["sales_bot"]  # a fixture, used by name


def deal(recorder, token: str) -> dict:
    answer = run_agent(recorder, token, lambda client: client.call_tool("crm__get_deal",
                                                                        {"deal_id": "D-881"}))
    return {key: str(answer.structured_content[key]) for key in ("stage", "amount")}


def test_two_changes_of_one_record_by_the_run_are_undone_in_turn_with_no_conflict(
        recorder, sales_bot, sample_servers, on_call, approver_user, second_approver):
    _, token = sales_bot
    before = deal(recorder, token)

    async def script(client):
        await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})
        await client.call_tool("crm__update_deal", {"deal_id": "D-881", "amount": 50000})

    run_agent(recorder, token, script)
    run = Run.objects.filter(agent__name="sales-bot", steps__tool="update_deal").distinct().get()
    stage, _ = run.steps.filter(tool="update_deal").order_by("number")
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong deal", from_step=stage.number)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == "ready" and services.conflict_positions(plan) == set()
    first = plan.items.get(step=stage)
    assert first.undo_words == ("Put back stage: Won → Proposal (the agent's change was “Deal D-881 stage: "
                                "Proposal → Won”), once the undos of the run's later changes to this record "
                                "have run first: changed since only by the run itself, as it left it")
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    outcomes = {item.step.number: item.outcome for item in plan.items.select_related("step")}
    assert plan.state == "completed" and set(outcomes.values()) == {"compensated"}, outcomes
    assert len(ops(sample_servers, "crm")) == 2
    assert deal(recorder, token) == before


def test_an_overwrite_of_two_changes_of_one_record_undoes_both(
        recorder, sales_bot, sample_servers, on_call, approver_user, second_approver, dana):
    """The run changed the deal twice; then ops-bot changed its amount. Both undos are in conflict with
    ops-bot's change; the approvers overwrite both. The first undo moves the record on; the second is sent
    conditional on where the first left it, and both are undone once."""
    from journal import services as journal_services

    _, token = sales_bot

    async def script(client):
        await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})
        await client.call_tool("crm__update_deal", {"deal_id": "D-881", "close_date": "2027-03-01"})

    run_agent(recorder, token, script)
    ops_token = journal_services.create_agent(name="ops-bot", on_behalf_of=dana)[1]
    run_agent(recorder, ops_token, lambda client: client.call_tool(
        "crm__update_deal", {"deal_id": "D-881", "amount": 52000}))
    run = Run.objects.filter(agent__name="sales-bot", steps__tool="update_deal").distinct().get()
    stage = run.steps.filter(tool="update_deal").order_by("number").first()
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong deal", from_step=stage.number)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    conflicts = services.conflict_positions(plan)
    assert plan.state == "ready" and len(conflicts) == 2
    overwrite = {str(position): "overwrite" for position in conflicts}
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices=overwrite)
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    outcomes = {item.step.number: item.outcome for item in plan.items.select_related("step")}
    assert plan.state == "completed" and set(outcomes.values()) == {"compensated"}, outcomes
    assert len(ops(sample_servers, "crm")) == 2
    assert deal(recorder, token) == {"stage": "Proposal", "amount": "52000"}  # ops-bot's amount stays
