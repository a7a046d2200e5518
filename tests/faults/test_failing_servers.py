"""Executing against tool servers that fail in every way the sample servers can: each item ends in the
state it should, nothing crashes, and nothing is repeated that should not be."""

import pytest

from approver import services, tasks
from tests.approver.services.test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture
from tests.approver.services.test_executor import run_plan

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def approved(globex, on_call, approver_user, second_approver, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=3)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan.refresh_from_db()
    assert plan.state == "approved"
    return plan


@pytest.mark.parametrize(("mode", "outcome", "tries"), [
    ("rpc_error", "compensation_failed", 1),     # a JSON-RPC error: the server refused
    ("error_5xx", "compensation_failed", 4),     # transient; HATP honours the key, so retried, then failed
    ("garbage", "compensation_failed", 1),       # not MCP at all
    ("lie", "outcome_unknown", 1),               # an answer that is no tool result: it may have acted
    ("hang", "compensation_failed", 4),          # timed out each time; repeats are safe with the key
])
def test_each_failure_ends_the_item_in_the_right_state(
    approved, sample_servers, settings, mode, outcome, tries
):
    settings.TOOL_SERVER_TIMEOUT = 1
    sample_servers.set_mode("calendar", mode)
    waits = []
    plan = run_plan(approved, waits)
    event = plan.items.get(step__tool="create_event")
    assert (event.outcome, event.attempts) == (outcome, tries)
    assert event.outcome_detail.get("message") or event.outcome_detail.get("failureClass")
    assert waits == [1, 4, 16][: tries - 1]
    assert plan.state == "failed" and plan.execution_summary
    sample_servers.set_mode("calendar", "normal")
    # None of them acted (the liar answers without calling the tool, which we cannot know: hence unknown).
    assert [e for e in sample_servers.ledger("calendar") if e["op"] == "compensate"] == []


def test_a_server_that_does_not_answer_and_cannot_promise_idempotency_goes_to_a_human():
    from approver import execution

    verdict = execution.read_failure(failure_class="transient", message="payments did not answer in time",
                                     transient=True, may_have_acted=True, repeat_is_safe=False, attempt=1)
    assert verdict.outcome == "outcome_unknown" and not verdict.retry
