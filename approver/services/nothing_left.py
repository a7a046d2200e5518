"""Nobody signs nothing: a plan with nothing left to undo (every step in it was undone by an earlier plan, or
changed nothing) ends as soon as it is drafted, saying why, with no checks, no signatures and no messages.
A plan with a step that cannot be undone still goes to its approvers, who read its remedy and sign for it."""

from datetime import datetime

from django.utils import timezone

from journal import services as journal_services
from journal.telemetry import metrics

from .. import execution
from ..models import Plan, PlanItem
from ..models.plans import since_words

_OUTCOMES = {
    PlanItem.Action.ALREADY_UNDONE: execution.ALREADY_UNDONE,
    PlanItem.Action.NOTHING_TO_UNDO: execution.NO_COMPENSATION,
    PlanItem.Action.CANNOT_UNDO: execution.IRREVERSIBLE,
}


def numbers(steps: list[int]) -> str:
    """Step numbers as a person reads them: "step 3", "steps 2–4", "steps 1, 3 and 5"."""
    steps = sorted(set(steps))
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}–{steps[-1]}"
    return f"steps {', '.join(map(str, steps[:-1]))} and {steps[-1]}"


def why_nothing_is_left(plan: Plan) -> str:
    """"Nothing left to undo: steps 2–4 were undone by plan 1a2b3c4d at 2026-12-04 02:14:00 UTC; step 5
    cannot be undone"."""
    items = list(plan.items.select_related("step").order_by("step__number"))
    parts = []
    undone = {}
    for number, by, at in PlanItem.objects.filter(
            step_id__in=[i.step_id for i in items if i.action == PlanItem.Action.ALREADY_UNDONE],
            outcome=execution.COMPENSATED).exclude(plan=plan).values_list(
            "step__number", "plan__public_id", "exec_finished_at"):
        undone.setdefault((str(by)[:8], at and since_words(at)), []).append(number)
    for (by, at), steps in sorted(undone.items(), key=lambda kv: min(kv[1])):
        were = "was" if len(steps) == 1 else "were"
        parts.append(f"{numbers(steps)} {were} undone by plan {by}" + (f" at {at}" if at else ""))
    for action, words in ((PlanItem.Action.NOTHING_TO_UNDO, "changed nothing"),
                          (PlanItem.Action.CANNOT_UNDO, "cannot be undone (see the to-do list)")):
        steps = [i.step.number for i in items if i.action == action]
        if steps:
            parts.append(f"{numbers(steps)} {words}")
    return ("Nothing left to undo: " + "; ".join(parts or ["the plan is empty"]))[:300]


def end_at_once(plan: Plan, *, now: datetime | None = None) -> None:
    """End a drafted plan that has no compensation to run. The caller holds the plan's row lock."""
    now = now or timezone.now()
    for action, outcome in _OUTCOMES.items():
        for item in plan.items.filter(action=action):
            ended = PlanItem.objects.filter(pk=item.pk).exclude(exec_state=PlanItem.Exec.DONE).update(
                exec_state=PlanItem.Exec.DONE, outcome=outcome, outcome_detail={"message": item.reason},
                exec_finished_at=now, holds_step=False)
            metrics.counted(metrics.COMPENSATIONS, outcome, ended)
    outcomes = list(plan.items.values_list("outcome", flat=True))
    plan.state = execution.finished_state(outcomes, stopped=False)
    plan.execution_summary = why_nothing_is_left(plan)
    plan.updated_at = now
    plan.outcome_notified = plan.execution_notified = True  # nobody is told of a plan that did nothing
    plan.save(update_fields=["state", "execution_summary", "updated_at", "outcome_notified",
                             "execution_notified"])
    journal_services.record_event(run_id=plan.run_id, event="plan_executed", now=now, data={
        "plan": str(plan.public_id), "state": plan.state, "summary": plan.execution_summary,
        "stopReason": None, "nothingLeft": True})
