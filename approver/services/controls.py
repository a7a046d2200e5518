"""What people do to a plan that is approved or running: pause it (the item in flight finishes, nothing
more starts), resume it, or abort it (what has not started is skipped). Each change commits with its entry
on the run's chain; the executor (`executor`) checks the plan's state before every item."""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from journal import services as journal_services

from ..models import Plan
from .executor import enter_executing, finish_if_done, queue_execution, stop_what_is_left


def abort_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Stop an approved, executing or paused plan. The executor checks before every item, so the one in
    flight finishes and nothing after it starts; a plan no worker is running is finished here."""
    now = now or timezone.now()
    reason = f"Aborted by {by.get_username()}."
    with transaction.atomic():  # the abort and its chain entry commit together
        if not Plan.objects.filter(pk=plan.pk, state__in=Plan.STOPPABLE_STATES, stop_reason="").update(
                stop_reason=reason, updated_at=now):
            return False
        journal_services.record_event(run_id=plan.run_id, event="plan_aborted", now=now, data={
            "plan": str(plan.public_id), "by": by.get_username()})
    if enter_executing(plan=plan, from_states=(Plan.State.APPROVED, Plan.State.PAUSED), now=now):
        stop_what_is_left(plan, reason, now)
        finish_if_done(plan, now)  # leaves it to the executor if an item is still in flight
    else:
        queue_execution(plan=plan)  # executing: one that waits for another plan's lease ends now too
    return True


def pause_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Hold an approved or executing plan: the item in flight finishes, nothing after it starts until someone
    resumes (or aborts) it. Approvals are re-checked when it resumes, as before every item."""
    now = now or timezone.now()
    with transaction.atomic():  # the pause and its chain entry commit together
        if not Plan.objects.filter(pk=plan.pk, state__in=Plan.RUNNABLE_STATES, stop_reason="").update(
                state=Plan.State.PAUSED, paused_by=by.get_username(), paused_at=now, updated_at=now):
            return False
        journal_services.record_event(run_id=plan.run_id, event="plan_paused", now=now, data={
            "plan": str(plan.public_id), "by": by.get_username()})
    return True


def resume_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Let a paused plan go on from the next item not started."""
    now = now or timezone.now()
    with transaction.atomic():
        if not enter_executing(
            plan=plan,
            from_states=(Plan.State.PAUSED,),
            now=now,
            only_if={"stop_reason": ""},
            paused_by="",
            paused_at=None,
        ):
            return False
        journal_services.record_event(run_id=plan.run_id, event="plan_resumed", now=now, data={
            "plan": str(plan.public_id), "by": by.get_username()})
        queue_execution(plan=plan)
    return True
