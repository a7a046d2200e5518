"""Compensations whose outcome nobody knows: checked again, settled by hand, or tried again with the same
idempotency key, against the real calendar server, whose ledger says what really happened."""

import pytest

from approver import services

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import approved, ops, run_plan  # noqa: F401, F811 - fixture and helpers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def answer_lost(approved, sample_servers, settings):  # noqa: F811 - the fixture imported above
    """The calendar cancels the meeting but its answer never comes back, on every try: the meeting's
    outcome is unknown (the server honours the key, so the executor tried 4 times, acting once)."""
    settings.TOOL_SERVER_TIMEOUT = 1
    sample_servers.set_mode("calendar", "act_then_hang")
    plan = run_plan(approved("overwrite"))
    sample_servers.set_mode("calendar", "normal")
    event = plan.items.get(step__tool="create_event")
    assert event.outcome == "outcome_unknown" and event.attempts == 4, event.outcome_detail
    assert plan.state == "failed"
    assert plan.items.get(step__tool="update_deal").outcome == "skipped"  # it may rest on the meeting
    assert len(ops(sample_servers, "calendar")) == 1  # acted on the first try; the key held after that
    return plan, event


def test_an_unknown_outcome_is_checked_then_tried_again_with_the_same_key(answer_lost, sample_servers,
                                                                          approver_user, on_call, client):
    from django.urls import reverse

    plan, event = answer_lost
    client.force_login(on_call)  # on-call asks the server, changing nothing
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert "Check again" in page and "Try again" not in page  # trying again is an approver's call
    client.post(reverse("approver:check_outcome", args=[plan.public_id, event.position]))
    event.refresh_from_db()
    assert event.outcome == "outcome_unknown"
    checked = event.outcome_detail["checked"]
    assert checked["by"] == "olivia" and checked["message"] == "This change was already undone."
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert "This change was already undone." in page
    # When it was asked reads as a time, not as an ISO string.
    from datetime import datetime

    from django.utils import timezone
    from django.utils.formats import date_format

    at = timezone.localtime(datetime.fromisoformat(checked["at"]))
    shown = date_format(at, "M j, H:i")
    moment = f'<time datetime="{at.isoformat()}" data-format="M j, H:i">{shown} UTC</time>'
    assert f"Asked {moment} by olivia" in page

    client.force_login(approver_user)
    response = client.post(reverse("approver:retry_outcome", args=[plan.public_id, event.position]))
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.state == "executing"
    plan = run_plan(plan)
    event.refresh_from_db()
    # The replayed key returned the first outcome: compensated, and the calendar acted once in all.
    assert event.outcome == "compensated" and event.outcome_detail["summary"]
    [cancel] = ops(sample_servers, "calendar")
    assert cancel["idempotencyKey"] == event.idempotency_key
    assert plan.state == "partially_completed"  # the deal was skipped for the meeting's sake, and stays so
    assert plan.run.entries.filter(event="compensation_retried").count() == 1
    assert plan.compensation_run.steps.filter(tool="hatp_compensate", server_name="calendar").count() == 5


def test_a_human_settles_an_unknown_outcome_and_the_report_is_counted_again(answer_lost, on_call):
    plan, event = answer_lost
    with pytest.raises(services.NotSettled):
        services.settle_unknown(plan=plan, position=event.position, by=on_call, settlement="perhaps")
    settled = services.settle_unknown(
        plan=plan, position=event.position, by=on_call, settlement="took_effect"
    )
    assert settled.state == "partially_completed"
    assert settled.execution_summary == "Reversed 1 of 2 actions; 1 skipped; 1 cannot be undone"
    event.refresh_from_db()
    assert event.outcome == "compensated" and event.outcome_detail["settledBy"] == "olivia"
    with pytest.raises(services.NotSettled, match="not unknown"):  # once only
        services.settle_unknown(plan=plan, position=event.position, by=on_call, settlement="did_not")
    assert plan.run.entries.filter(event="outcome_settled", data__by="olivia").count() == 1


def test_no_new_plan_undoes_a_step_again_while_its_last_undo_is_unknown(answer_lost, sample_servers, on_call,
                                                                        approver_user):
    """Finding 4: Plan the rest refused such a step, but a fresh plan from the run page (or since a moment)
    drafted it again and would have sent the same compensation under a new key. Every plan now carries it as
    cannot be undone until settled, naming the plan to settle it on; once settled, it is undone again."""
    from django.utils import timezone

    plan, event = answer_lost
    short = str(plan.public_id)[:8]
    agent = plan.run.agent
    asks = (lambda: services.request_plan(run=plan.run, requested_by=on_call, reason="again", from_step=1),
            lambda: services.request_plan_since(agent=agent, requested_by=on_call, reason="again",
                                                since=timezone.now() - timezone.timedelta(hours=1)))
    for ask in asks:
        other = ask()
        item = other.items.get(step=event.step)
        assert item.action == "cannot_undo" and item.idempotency_key == ""
        assert item.reason == (f"Plan {short} sent this step's undo and nobody knows whether it took effect: "
                               "it cannot be undone again until that is settled.")
        assert item.remedy.startswith(f"On plan {short}'s report, check again or say how it ended")
        services.cancel_plan(plan=other, by=on_call)
    services.settle_unknown(plan=plan, position=event.position, by=approver_user, settlement="did_not")
    again = services.request_plan(run=plan.run, requested_by=on_call, reason="again", from_step=1)
    assert again.items.get(step=event.step).action == "compensate"
    assert len(ops(sample_servers, "calendar")) == 1  # nothing more was sent meanwhile
