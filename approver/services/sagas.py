"""Unwinding a run after a failed call (ChronoMCP's saga mode, as an autonomy policy's "when a call fails").

A failed call under a policy that says "propose" or "unwind" stops the run: a reversal plan is opened for
the run's task (from the step the agent marked `sagaStart`, else from step 1), and the run is halted, so the
agent's further calls in it are refused until that plan ends or a person releases the run. "propose" leaves
the plan to its checks and approvers like any plan. "unwind" checks it and runs it at once when the policies
let it run without a human (their existing rule for plans), before the agent hears of its failure;
otherwise it falls back to "propose". Compensations are the declared ones only, with their resolved
arguments, never a model's choice; what cannot be undone is a boundary reported, never crossed. Everything
(the failure, the plan, the halt, each compensation, the release) is on the run's chain.
"""

import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from journal import services as journal_services
from journal.models import Run, Step
from journal.record import journaling

from .. import execution
from ..content import plan_url
from ..models import Plan
from ..policy_book import plan_needs_a_human
from .checking import run_checks
from .executor import execute_plan
from .plans import PlanRefused, request_plan

SAGA_START = "sagaStart"
UNWIND_POLL_SECONDS = 0.1


def task_start(run: Run, failed: Step) -> int:
    """Where the failed call's task began: the latest earlier step the agent marked `sagaStart`, else 1."""
    for number, meta in (Step.objects.filter(run=run, number__lte=failed.number).order_by("-number")
                         .values_list("number", "request_meta")):
        if journaling.agent_journal(meta).get(SAGA_START) is True:
            return number
    return 1


def start_saga(*, run_id: int, step_id: int, mode: str, now: datetime | None = None) -> dict[str, Any]:
    """Open the plan that undoes the failed call's task and halt the run (see the module). Returns the plan's
    id and URL, or why no plan could be made (then the run is not halted: nothing would end the halt)."""
    now = now or timezone.now()
    run = Run.objects.select_related("agent__on_behalf_of").get(pk=run_id)
    failed = Step.objects.get(pk=step_id)
    start = task_start(run, failed)
    reason = (f"Automatic: step {failed.number} ({failed.namespaced_tool}) failed, and the policy says to "
              f"{'unwind' if mode == 'unwind' else 'propose an undo of'} the task begun at step {start}.")
    # The saga's entry, its plan (or why there is none) and the halt commit together: a run is never left
    # halted without its plan, nor a saga on its chain that did nothing.
    with transaction.atomic():
        journal_services.record_event(run_id=run.pk, event="saga", now=now, data={
            "failedStep": failed.number, "mode": mode, "fromStep": start})
        if (too_many := _too_many_open(run)) is not None:
            journal_services.record_event(run_id=run.pk, event="saga_refused", now=timezone.now(),
                                          data={"failedStep": failed.number, "why": too_many})
            return {"refused": too_many}
        try:
            with transaction.atomic():  # a refused plan leaves nothing of itself behind
                # Requested for the agent's person: they are who the agent acted for (and so may not approve
                # it).
                plan = request_plan(run=run, requested_by=run.agent.on_behalf_of, reason=reason,
                                    from_step=start, now=now, saga=True)
        except PlanRefused as refused:
            journal_services.record_event(run_id=run.pk, event="saga_refused", now=timezone.now(),
                                          data={"failedStep": failed.number, "why": refused.message})
            return {"refused": refused.message}
        url = plan_url(plan, absolute=True)
        journal_services.halt_run(
            run_id=run.pk,
            plan=str(plan.public_id),
            now=timezone.now(),
            reason=(
                f"Step {failed.number} ({failed.namespaced_tool}) failed, and the run's task is being "
                f"undone: {url}"
            ),
        )
    return {"plan": plan.pk, "url": url}


def _too_many_open(run: Run) -> str | None:
    """Why no more plans may be opened for this agent's failures, if it has SAGA_OPEN_PLANS_PER_AGENT open
    already (an agent, or a failing server, would otherwise open plans and mail approvers without end; the
    agent is halted by the first of them meanwhile)."""
    open_plans = Plan.objects.filter(run__agent_id=run.agent_id, saga=True, state__in=Plan.OPEN_STATES)
    count = open_plans.count()
    if count < settings.SAGA_OPEN_PLANS_PER_AGENT:
        return None
    return (f"{run.agent.name} already has {count} undo plan{'s' if count != 1 else ''} open after failed "
            "calls; no more are opened until a person has looked at those.")


def unwind(*, plan_id: int) -> dict[str, Any]:
    """Check the plan now and, when no human is needed, run it now: what was reversed, what could not be and
    why, in the words of the error result's `_meta["hatp/journal"]["unwound"]`. When a human is needed the
    plan waits for approvers, and the answer says why."""
    plan = Plan.objects.get(pk=plan_id)
    checked = run_checks(plan=plan, check_round=plan.check_round) or Plan.objects.get(pk=plan_id)
    if checked.state != Plan.State.APPROVED:
        why = (
            plan_needs_a_human(checked)
            if checked.state == Plan.State.READY
            else f"the plan is {checked.state}"
        )
        return {"plan": plan_url(checked, absolute=True), "state": checked.state,
                "proposed": f"A person must approve this undo: {why}"}
    # The worker was rung when the plan was approved and may be at it too: each item is claimed once, so
    # whoever is free takes the next; this waits for the end (the Recorder stops waiting at its own limit).
    deadline = time.monotonic() + settings.RECORDER_UNWIND_SECONDS
    done = execute_plan(plan=checked)
    while done.state in (Plan.State.APPROVED, Plan.State.EXECUTING) and time.monotonic() < deadline:
        time.sleep(UNWIND_POLL_SECONDS)
        done = execute_plan(plan=done, later=lambda seconds: None)  # the first call rang for any retry
    return unwound(done)


def unwound(plan: Plan) -> dict[str, Any]:
    """What a plan has reversed so far, and what it could not, as the agent is told."""
    reversed_, not_reversed = [], []
    for item in plan.items.select_related("step").order_by("position"):
        step = {"step": item.step.number, "tool": item.step.namespaced_tool}
        if item.outcome == execution.COMPENSATED:
            reversed_.append({**step, "summary": (item.outcome_detail or {}).get("summary") or ""})
        elif item.outcome and item.outcome not in (execution.NO_COMPENSATION, execution.ALREADY_UNDONE):
            not_reversed.append({**step, "outcome": item.outcome,
                                 "why": (item.outcome_detail or {}).get("message") or item.reason or ""})
        elif not item.outcome and item.action == "compensate":
            not_reversed.append({**step, "outcome": "not yet", "why": "still being undone"})
    return {"plan": plan_url(plan, absolute=True), "state": plan.state, "summary": plan.execution_summary,
            "reversed": reversed_, "notReversed": not_reversed}


def halting(*, plan: str) -> str | None:
    """Why calls into a run this plan halted are refused, or None once the plan is no longer open."""
    row = Plan.objects.filter(public_id=plan).values_list("state", "run__halted_reason").first()
    if row is None or row[0] not in Plan.OPEN_STATES:
        return None
    return (
        f"This run is halted: {row[1]} Calls in it are refused until that plan ends or a person releases the "
        "run from its page."
    )
