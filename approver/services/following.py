"""Plans that follow a held call. A plan drafted while a call was held for approval says of its step what
was true then ("held for approval and not made"); once the call is approved, and once it is sent (by the
held step itself, or by the agent's next identical call, a step of its own), that is no longer so. Every
plan still open for signing that covers the held step is drafted again from the record as it is now: the
approved call's real undo (or why it cannot be undone, with its remedy), and, for a plan of every step from
N, the step that carried it. The new draft has a new digest, so approvals given on the old one no longer
count, as for any change of a plan's content. "Check again" on a plan whose held steps moved on does the
same. A plan past its sign-off keeps what was signed; its report says what it undid."""

import functools
import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from journal import services as journal_services

from .. import planning
from ..models import Plan, PlanItem
from . import bell

logger = logging.getLogger(__name__)
# A plan being drafted reads the record when its worker gets to it; one signed goes as it was signed.
REDRAFTABLE = (Plan.State.DRAFT, Plan.State.CHECKING, Plan.State.READY)


def after_commit(*, step_id: int | None, why: str, now: datetime | None = None) -> None:
    """`redraft_plans_covering` once the current transaction commits, in transactions of its own: a plan's
    row is never locked while the caller holds a run's or a held call's (whoever signs a plan locks the plan,
    then its run), and a draft that fails to start leaves the decision made (Check again draws it then)."""
    transaction.on_commit(functools.partial(_redraft_logged, step_id=step_id, why=why, now=now))


def _redraft_logged(**kwargs) -> None:
    try:
        redraft_plans_covering(**kwargs)
    except Exception:
        logger.exception("could not draw again the plans covering step %s", kwargs.get("step_id"))


def redraft_plans_covering(*, step_id: int | None, why: str, now: datetime | None = None) -> int:
    """Draft again every plan open for signing that has an item for step `step_id`; how many."""
    if step_id is None:
        return 0
    plan_ids = set(PlanItem.objects.filter(step_id=step_id, plan__state__in=REDRAFTABLE)
                   .values_list("plan_id", flat=True))
    return sum(redraft(plan_id=plan_id, why=why, now=now) for plan_id in sorted(plan_ids))


def redraft(*, plan_id: int, why: str, now: datetime | None = None) -> bool:
    """Send the plan back to the worker to be drafted again from the record as it is now (`draft_plan`
    starts from nothing: its items are written anew, then checked). On the run's record, with why. False
    when the plan is no longer open for signing."""
    now = now or timezone.now()
    with transaction.atomic():
        plan = Plan.objects.select_for_update().filter(pk=plan_id, state__in=REDRAFTABLE).first()
        if plan is None:
            return False
        Plan.objects.filter(pk=plan.pk).update(
            state=Plan.State.DRAFTING, drafting_since=None, draft_done=0, draft_total=0, checks_done=0,
            updated_at=now)
        journal_services.record_event(run_id=plan.run_id, event="plan_redrafted", now=now, data={
            "plan": str(plan.public_id), "why": why, "digest": plan.digest})
        bell.ring(bell.DRAFT_PLAN, plan.pk)
    return True


def held_steps_moved_on(plan: Plan) -> bool:
    """Whether a step the plan was drafted on while it was held is held no more (approved, sent, or
    closed unsent): its item no longer says what is true."""
    return plan.items.filter(reason=planning.HELD_NOT_MADE).exclude(step__status="held").exists()

