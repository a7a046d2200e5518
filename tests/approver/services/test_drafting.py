"""Drafting a plan in the worker: the web request opens it at once, the worker writes its items in batches
(the page shows how far it got), and a draft left by a dead worker, cancelled, or overtaken by another plan
ends honestly, never with items written twice or a plan half made."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approver import services, tasks
from approver.models import Plan, PlanItem
from approver.services import plans as plan_services

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rung(monkeypatch):
    """What the services asked the worker to do, instead of a broker."""
    asked = []
    monkeypatch.setattr(tasks.draft_plan, "delay", lambda *args: asked.append(("draft", *args)))
    monkeypatch.setattr(tasks.check_plan, "delay", lambda *args: asked.append(("check", *args)))
    return asked


def test_asking_opens_a_plan_at_once_and_the_worker_drafts_it_in_batches(globex, on_call, rung, monkeypatch):
    plan = services.ask_for_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=1)
    assert plan.state == "drafting" and not plan.items.exists() and rung == [("draft", plan.pk)]
    assert not globex.entries.filter(event="plan").exists()  # nothing is on the record until it is drafted

    seen = []
    monkeypatch.setattr(plan_services, "DRAFT_BATCH", 1)
    written = PlanItem.objects.bulk_create

    def watching(rows, **kwargs):
        seen.append(Plan.objects.values_list("draft_done", "draft_total").get(pk=plan.pk))
        return written(rows, **kwargs)

    monkeypatch.setattr(PlanItem.objects, "bulk_create", watching)
    assert tasks.draft_plan(plan.pk) == "checking"
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4)]  # the page could read each step of the way
    plan.refresh_from_db()
    assert (plan.draft_done, plan.draft_total, plan.items.count(), plan.check_round) == (4, 4, 4, 1)
    assert plan.digest and plan.checks_total == 2 and rung[-1] == ("check", plan.pk, 1)
    assert globex.entries.get(event="plan").data["digest"] == plan.digest
    assert tasks.draft_plan(plan.pk) == "checking"  # run twice: nothing more happens
    assert plan.items.count() == 4 and globex.entries.filter(event="plan").count() == 1


def test_a_draft_a_dead_worker_left_is_started_again_from_nothing(globex, on_call, rung, monkeypatch):
    plan = services.ask_for_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    monkeypatch.setattr(plan_services, "DRAFT_BATCH", 2)
    made = plan_services._item_row
    calls = []

    def dies_on_the_third(plan_, draft, *rest):
        calls.append(draft)
        if len(calls) == 3:
            raise SystemExit("the worker was killed")
        return made(plan_, draft, *rest)

    monkeypatch.setattr(plan_services, "_item_row", dies_on_the_third)
    with pytest.raises(SystemExit):
        services.draft_plan(plan=plan)
    plan.refresh_from_db()
    assert plan.state == "drafting" and plan.draft_done == 2 and plan.items.count() == 2
    assert tasks.draft_plan(plan.pk) == "drafting"  # another worker leaves it: it is not stale yet
    assert tasks.requeue_stalled_checks() == 0

    monkeypatch.setattr(plan_services, "_item_row", made)
    Plan.objects.filter(pk=plan.pk).update(
        updated_at=timezone.now() - services.DRAFT_STALE - timedelta(seconds=1)
    )
    assert tasks.requeue_stalled_checks() == 1 and rung[-1] == ("draft", plan.pk)
    assert tasks.draft_plan(plan.pk) == "checking"
    assert sorted(plan.items.values_list("step__number", flat=True)) == [1, 2, 3, 4]


def test_a_plan_cancelled_while_drafting_stops_and_holds_no_step(
    globex, on_call, approver_user, rung, monkeypatch
):
    plan = services.ask_for_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    monkeypatch.setattr(plan_services, "DRAFT_BATCH", 2)
    made = plan_services._item_row

    def cancelled_midway(plan_, draft, *rest):
        if PlanItem.objects.filter(plan_id=plan.pk).count() == 2 and Plan.objects.get(pk=plan.pk).is_open:
            assert services.cancel_plan(plan=plan, by=approver_user)
        return made(plan_, draft, *rest)

    monkeypatch.setattr(plan_services, "_item_row", cancelled_midway)
    assert services.draft_plan(plan=plan).state == "cancelled"
    assert not PlanItem.objects.filter(holds_step=True).exists() and plan.items.count() == 2
    again = services.request_plan(run=globex, requested_by=on_call, reason="again", from_step=1)
    assert again.state == "checking" and again.items.count() == 4


def test_a_step_another_plan_took_meanwhile_ends_the_draft_saying_which(globex, on_call, client, rung):
    wide = services.ask_for_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    first = services.request_plan(run=globex, requested_by=on_call, reason="first", steps=[3])
    cancelled = services.draft_plan(plan=wide)
    assert cancelled.state == "cancelled" and not cancelled.items.exists()
    assert (
        cancelled.stop_reason
        == "Step 3 is already in an open plan (checking); finish or cancel that plan first."
    )
    client.force_login(on_call)
    page = client.get(f"/plans/{cancelled.public_id}/").content.decode()
    assert (
        "Cancelled: Step 3 is already in an open plan" in page
        and first.items.filter(holds_step=True).count() == 2
    )


def test_what_the_request_refuses_at_once_makes_no_plan(globex, on_call, rung):
    services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=4)
    for ask in ({"from_step": 9}, {"steps": [2, 7]}, {"from_step": 3}, {"steps": [4]}):
        with pytest.raises(services.PlanRefused):
            services.ask_for_plan(run=globex, requested_by=on_call, reason="r", **ask)
    assert Plan.objects.count() == 1 and not [r for r in rung if r[0] == "draft"]
