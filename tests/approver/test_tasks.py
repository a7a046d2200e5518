"""The check task is the doorbell: safe to ring twice, and rung again for checks a dead worker left."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approver import services, tasks
from approver.models import Plan, PlanItem

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_check_left_half_done_by_a_dead_worker_is_rung_again_and_finishes(globex, on_call, monkeypatch):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    # The worker answered one item, then died: the plan sat in `checking` for a long while.
    deal = plan.items.get(step__tool="update_deal")
    services.record_checks(plan=plan, check_round=1, results=[
        (deal.pk, services.CheckResult("ok", {"wouldDo": "Deal D-881 stage: Won → Proposal"}))])
    Plan.objects.filter(pk=plan.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    rung = []
    monkeypatch.setattr(tasks.check_plan, "delay", lambda *args: rung.append(args))
    assert tasks.requeue_stalled_checks() == 1 and rung == [(plan.pk, 1)]

    assert tasks.check_plan(*rung[0]) == "ready"
    plan.refresh_from_db()
    assert (plan.checks_done, plan.checks_total) == (2, 2)
    assert set(plan.items.filter(action="compensate").values_list("check_status", flat=True)) == {"ok"}
    # Ringing again changes nothing, and neither does a bell for a round that is over.
    digest = plan.digest
    assert tasks.check_plan(plan.pk, 1) == "moved on"
    assert services.queue_checks(plan=plan, ring=False)
    assert tasks.check_plan(plan.pk, 1) == "moved on"
    assert tasks.check_plan(plan.pk, 2) == "ready"
    plan.refresh_from_db()
    assert plan.digest == digest and plan.checks_done == 2


def test_a_live_check_is_not_rung_again(globex, on_call, monkeypatch):
    services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    rung = []
    monkeypatch.setattr(tasks.check_plan, "delay", lambda *args: rung.append(args))
    assert tasks.requeue_stalled_checks() == 0 and rung == []


def test_a_late_answer_from_an_old_round_is_not_kept(globex, on_call):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    services.run_checks(plan=plan, check_round=1)
    assert services.queue_checks(plan=plan, ring=False)
    deal = plan.items.get(step__tool="update_deal")
    services.record_checks(plan=plan, check_round=1, results=[(deal.pk, services.CheckResult("error", {}))])
    deal.refresh_from_db()
    assert deal.check_status == PlanItem.Check.PENDING


def test_the_check_task_for_a_plan_that_is_gone_says_so():
    assert tasks.check_plan(987654, 1) == "no such plan"
