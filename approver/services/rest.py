"""Plan the rest: when a plan stops short (a conflict kept, a failure, a pause or an abort, approvals that
lapsed), a new plan for exactly what it did not undo, and what depends on that, linked both ways.

Nothing is done twice: what the first plan undid is not in the rest (a later step it undid is drafted as
already undone), and while one of its outcomes is unknown there is no rest to plan, since it cannot be said
whether that compensation took effect. The rest is drafted, checked and signed like any plan, and its
approvers are told when it is ready.
"""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from journal import services as journal_services

from .. import execution, traced
from ..models import Plan
from . import bell
from .plans import PlanRefused, refuse_if_held_steps


def live_rest(plan: Plan) -> Plan | None:
    """Where the plan's rest went: its newest rest plan that was not cancelled, if any."""
    return (plan.rest_plans.exclude(state=Plan.State.CANCELLED).select_related("requested_by")
            .order_by("-created_at", "-id").first())


def rest_refusal(plan: Plan) -> str:
    """Why the plan has no rest to plan now ("" when it has): it has not finished, it undid everything it
    could, its rest is planned already, or one of its outcomes is unknown."""
    if plan.state not in Plan.FINISHED_STATES:
        return "Only a plan that has finished can leave a rest to plan."
    if (rest := live_rest(plan)) is not None:
        return f"The rest is in plan {str(rest.public_id)[:8]} already."
    left = list(plan.not_yet_undone().select_related("step").order_by("position"))
    if not left:
        return "Everything this plan could undo is undone."
    unknown = [item.step.number for item in left if item.outcome == execution.OUTCOME_UNKNOWN]
    if unknown:
        steps = ", ".join(map(str, unknown))
        return (f"Nobody knows yet whether the undo of step {steps} took effect: say how it ended (above) "
                "first, so that nothing is undone twice.")
    return ""


def plan_the_rest(*, plan: Plan, requested_by, now: datetime | None = None) -> Plan:
    """Open the rest of `plan` as a new plan (`drafting`; the worker drafts and checks it): the steps it did
    not undo, for the same reason, linked to it. Refused (PlanRefused) as `rest_refusal` says, or when one
    of those steps is in another open plan (`open_plan` names it)."""
    now = now or timezone.now()
    with transaction.atomic():
        first = Plan.objects.select_for_update(of=("self",)).select_related("run").get(pk=plan.pk)
        refusal = rest_refusal(first)
        if refusal:
            raise PlanRefused(refusal, open_plan=live_rest(first))
        left = list(first.not_yet_undone().select_related("step").order_by("step__run_id", "step__number"))
        refuse_if_held_steps([item.step_id for item in left])
        rest = traced.new_plan(
            run=first.run, since=first.since, rest_of=first, requested_by=requested_by, reason=first.reason,
            chosen_steps=[] if first.since else [item.step.number for item in left], created_at=now,
            updated_at=now, state=Plan.State.DRAFTING)
        rest.runs.add(*first.runs.all())
        journal_services.record_event(run_id=first.run_id, event="plan_rest", now=now, data={
            "plan": str(first.public_id), "rest": str(rest.public_id), "by": requested_by.get_username(),
            "steps": [item.step.number for item in left]})
        bell.ring(bell.DRAFT_PLAN, rest.pk)
    return rest
