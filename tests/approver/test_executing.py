"""Executing approved plans against the real sample servers: reverse order, exactly once, honest report.
The servers' ledgers, not our database, say what really happened."""

import pytest

from approver import services, tasks
from approver.models import Plan

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def approved(globex, on_call, approver_user, second_approver, sample_servers, monkeypatch):
    """The Globex plan from step 1 after a colleague raised the deal, approved by Ana and Bo with `choice`
    on the deal's conflict; execution is rung, not run, so each test runs it."""
    rung = []
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: rung.append(args))

    def make(choice: str) -> Plan:
        sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
        plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        for user in (approver_user, second_approver):
            approve(plan, user, enrolled(user), choices={"3": choice})
        plan.refresh_from_db()
        assert plan.state == "approved" and rung == [(plan.pk,)]  # queued when the quorum was reached
        return plan

    return make


def ops(sample_servers, name):
    return [entry for entry in sample_servers.ledger(name) if entry["op"] == "compensate"]


def test_an_approved_plan_is_undone_most_recent_first(approved, sample_servers):
    plan = services.execute_plan(plan=approved("overwrite"), sleep=lambda _: None)
    assert plan.state == "completed" and plan.execution_summary == "Reversed 2 of 3 actions; 1 cannot be undone"
    outcomes = [(i.step.tool, i.outcome) for i in plan.items.order_by("position").select_related("step")]
    assert outcomes == [("send_email", "irreversible"), ("create_event", "compensated"),
                        ("update_deal", "compensated"), ("get_deal", "no_compensation")]
    # The calendar cancelled the kickoff (and told the attendees) before the deal went back.
    [cancel], [deal] = ops(sample_servers, "calendar"), ops(sample_servers, "crm")
    assert [n["to"] for n in cancel["notices"]] == ["dana@acme.example", "buyer@globex.example", "cto@globex.example"]
    assert deal["version"] == "v15"
    assert deal["idempotencyKey"] == plan.items.get(step__tool="update_deal").idempotency_key
    events = [e.data.get("step") for e in plan.run.entries.filter(event="compensation").order_by("seq")]
    assert events == [4, 3, 2, 1]
    assert not plan.items.filter(holds_step=True).exists()


def test_keeping_the_colleagues_change_leaves_the_deal_alone(approved, sample_servers):
    plan = services.execute_plan(plan=approved("keep_newer"), sleep=lambda _: None)
    deal = plan.items.get(step__tool="update_deal")
    assert deal.outcome == "skipped" and "keep the newer change" in deal.outcome_detail["message"]
    assert ops(sample_servers, "crm") == [] and len(ops(sample_servers, "calendar")) == 1
    assert plan.state == "partially_completed"


def test_running_the_plan_twice_compensates_nothing_twice(approved, sample_servers):
    plan = approved("overwrite")
    services.execute_plan(plan=plan, sleep=lambda _: None)
    again = services.execute_plan(plan=plan, sleep=lambda _: None)
    assert again.state == "completed"
    assert len(ops(sample_servers, "crm")) == 1 and len(ops(sample_servers, "calendar")) == 1


def test_a_colleague_racing_the_undo_is_never_overwritten(approved, sample_servers):
    plan = approved("overwrite")  # Ana and Bo chose to overwrite v14...
    sample_servers.colleague_update("D-881", {"stage": "Negotiation"}, by="priya")  # ...but it is v15 now
    plan = services.execute_plan(plan=plan, sleep=lambda _: None)
    deal = plan.items.get(step__tool="update_deal")
    assert deal.outcome == "conflict" and deal.outcome_detail["current"]["changedBy"] == "priya"
    assert ops(sample_servers, "crm") == []
    # The deal stays, so nothing it depends on is undone: the read of step 1 needs nothing anyway.
    assert plan.state == "partially_completed"


def test_lapsed_approvals_stop_the_plan_before_anything_runs(approved, sample_servers, approver_user):
    plan = approved("overwrite")
    approver_user.groups.clear()  # Ana lost the approver role after signing
    plan = services.execute_plan(plan=plan, sleep=lambda _: None)
    assert plan.state == "failed" and "Only 1 of the 2 approvals" in plan.stop_reason
    assert set(plan.items.values_list("outcome", flat=True)) == {"skipped"}
    assert ops(sample_servers, "crm") == [] and ops(sample_servers, "calendar") == []


def test_a_server_that_fails_gets_the_item_failed_and_what_it_depends_on_is_kept(approved, sample_servers):
    plan = approved("overwrite")
    sample_servers.set_mode("calendar", "rpc_error")
    plan = services.execute_plan(plan=plan, sleep=lambda _: None)
    event = plan.items.get(step__tool="create_event")
    deal = plan.items.get(step__tool="update_deal")
    assert event.outcome == "compensation_failed"
    # The meeting (step 3) stays, and by the all-earlier rule it depends on the deal (step 2): kept too.
    assert deal.outcome == "skipped" and "Step 3 was not undone" in deal.outcome_detail["message"]
    assert ops(sample_servers, "crm") == []
    assert plan.state == "failed"
