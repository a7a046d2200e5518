"""What became of a run on the approval side, for the journal's pages (the journal's `story` port): which
plan undid each step, when and signed by whom; which open plan holds a step now; how each held call went
(held → approved by ana → sent); and which runs have a plan open. A few queries per page, never one per
step."""

from collections import defaultdict
from typing import Any

from django.db.models import Q
from django.urls import reverse

from journal import ports
from journal.models import Run, Step
from journal.record import journaling

from . import execution
from .models import ActionApproval, ActionRequest, Approval, Plan, PlanItem


def _plan(plan: Plan) -> dict[str, Any]:
    return {"id": str(plan.public_id), "short": str(plan.public_id)[:8],
            "state": plan.get_state_display().lower(),
            "url": reverse("approver:plan_detail", args=[plan.public_id])}


def _signers(plans: list[Plan]) -> dict[int, str]:
    """Who let each plan run: the approvers whose signatures of its final content it ran on, or the
    autonomy policies."""
    names: dict[int, list[str]] = defaultdict(list)
    approvals = Approval.objects.filter(plan__in=plans, decision=Approval.Decision.APPROVE)
    for plan_id, digest, name in approvals.order_by("created_at").values_list("plan_id", "digest",
                                                                              "approver__username"):
        if name not in names[plan_id] and any(p.pk == plan_id and p.digest == digest for p in plans):
            names[plan_id].append(name)
    words = {}
    for plan in plans:
        if plan.approved_by_policy:
            words[plan.pk] = "the autonomy policies (no human was needed)"
        elif names[plan.pk]:
            signed = names[plan.pk]
            words[plan.pk] = signed[0] if len(signed) == 1 else ", ".join(signed[:-1]) + " and " + signed[-1]
        else:
            words[plan.pk] = ""
    return words


def _undone(step_ids: list[int]) -> dict[int, dict[str, Any]]:
    items = list(PlanItem.objects.filter(step_id__in=step_ids, outcome=execution.COMPENSATED)
                 .select_related("plan").order_by("exec_finished_at"))
    signers = _signers(list({item.plan_id: item.plan for item in items}.values()))
    return {item.step_id: {**_plan(item.plan), "at": item.exec_finished_at, "by": signers[item.plan_id]}
            for item in items}


def _left(step_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The last finished plan that meant to undo each step and did not (a conflict kept, a failure, a
    stop)."""
    left = {}
    for item in (PlanItem.objects.filter(step_id__in=step_ids, outcome__in=execution.STOPS_DEPENDENCIES
                                         | {execution.SKIPPED}, plan__state__in=Plan.FINISHED_STATES)
                 .select_related("plan").order_by("exec_finished_at", "pk")):
        left[item.step_id] = {**_plan(item.plan), "at": item.exec_finished_at,
                              "outcome": execution.OUTCOME_WORDS.get(item.outcome, item.outcome)}
    return left


def _in_open_plan(step_ids: list[int]) -> dict[int, dict[str, Any]]:
    return {item.step_id: {**_plan(item.plan), "undoes": item.action == PlanItem.Action.COMPENSATE}
            for item in PlanItem.objects.filter(step_id__in=step_ids, holds_step=True,
                                                plan__state__in=Plan.OPEN_STATES).select_related("plan")}


def _trail(action: ActionRequest, step: Step, decisions: list[ActionApproval]) -> list[dict[str, Any]]:
    """How one held call went for this step, in order: held, each decision, and what became of the call."""
    trail: list[dict[str, Any]] = [{"what": "held", "at": action.created_at}]
    waited_here = action.step_id == step.pk or step.held_call == str(action.public_id)
    if (waited_here and step.status == Step.Status.ERROR and action.used_step_id != step.pk
            and action.state != ActionRequest.State.DENIED):  # a denial says itself why nothing was sent
        trail.append({"what": _NOT_SENT.get(step.held_end, "this attempt was not sent"),
                      "at": step.finished_at})
    for decision in decisions:
        verb = "approved" if decision.decision == ActionApproval.Decision.APPROVE else "denied"
        trail.append({"what": f"{verb} by {decision.approver.get_username()}"
                      + (f": “{decision.reason}”" if decision.reason else ""), "at": decision.created_at})
    if action.state == ActionRequest.State.USED:
        used = action.used_step
        if used is not None and not journaling.went_out(used):
            trail.append({"what": f"released for step {used.number}, which was not sent after all: "
                                  f"{used.error_message}", "at": action.used_at})
        elif action.used_step_id == step.pk:
            trail.append({"what": "sent", "at": action.used_at})
        else:
            trail.append({"what": "sent with the agent's next identical call "
                                  f"(step {action.used_step.number})", "at": action.used_at})
    elif action.state == ActionRequest.State.EXPIRED:
        trail.append({"what": "expired unused", "at": action.expires_at})
    elif action.state == ActionRequest.State.PENDING and step.status == Step.Status.HELD:
        trail.append({"what": "waiting for an approver", "at": None})
    return sorted(trail, key=lambda part: (part["at"] is None, part["at"] or action.created_at))


# How a held attempt that was never sent ended (`Step.held_end`), as its trail says it.
_NOT_SENT = {
    ports.HeldEnd.TOLD: "the agent was told it awaits approval; this attempt was not sent",
    ports.HeldEnd.HUNG_UP: "the agent stopped waiting; this attempt was not sent",
    ports.HeldEnd.LOST: "this attempt was never sent: the Recorder holding it stopped",
    ports.HeldEnd.LAPSED: "this attempt was not sent: its approval had expired or was used",
}


def _held(steps: dict[int, Step]) -> dict[int, dict[str, Any]]:
    ids = list(steps)
    waited_on = {step.held_call for step in steps.values() if step.held_call}
    actions = list(ActionRequest.objects.filter(Q(step_id__in=ids) | Q(used_step_id__in=ids)
                                                | Q(public_id__in=waited_on))
                   .select_related("used_step").order_by("created_at"))
    decisions: dict[int, list[ActionApproval]] = defaultdict(list)
    for decision in (ActionApproval.objects.filter(request__in=actions).select_related("approver")
                     .order_by("created_at")):
        decisions[decision.request_id].append(decision)
    held = {}
    for action in actions:
        these = {action.step_id, action.used_step_id} | {
            step.pk for step in steps.values() if step.held_call == str(action.public_id)}
        for step_id in these & set(ids):
            held[step_id] = {"url": reverse("approver:action_detail", args=[action.public_id]),
                             "state": action.get_state_display().lower(),
                             # What came of it, for the run page's words: sent once approved, or denied.
                             "sent": action.state == ActionRequest.State.USED and (
                                 action.used_step is None or journaling.went_out(action.used_step)),
                             "denied": action.state == ActionRequest.State.DENIED,
                             "trail": _trail(action, steps[step_id], decisions[action.pk])}
    return held


class Story:
    """The journal's `story` port, answered from the plans and held calls."""

    def steps(self, steps: list[Step]) -> dict[int, dict[str, Any]]:
        """By step id: `undone` (the plan, when, `by` whom), `left` (the last finished plan that did not
        undo it, and its outcome), `inPlan` (the open plan holding it) and `held` (its held call's page and
        trail), each only where it applies."""
        by_id = {step.pk: step for step in steps}
        stories: dict[int, dict[str, Any]] = defaultdict(dict)
        for key, found in (("undone", _undone(list(by_id))), ("left", _left(list(by_id))),
                           ("inPlan", _in_open_plan(list(by_id))), ("held", _held(by_id))):
            for step_id, story in found.items():
                stories[step_id][key] = story
        return dict(stories)

    def run(self, run: Run) -> dict[str, Any]:
        """`compensates`: the plan whose undo calls this run journals, if it is one."""
        plan = Plan.objects.filter(compensation_run=run).first()
        return {"compensates": _plan(plan)} if plan is not None else {}

    def runs(self, runs: list[Run]) -> dict[int, dict[str, Any]]:
        """By run id: `openPlan`, the newest open plan covering the run, and `compensates`."""
        ids = [run.pk for run in runs]
        stories: dict[int, dict[str, Any]] = defaultdict(dict)
        for plan in (Plan.objects.filter(Q(run_id__in=ids) | Q(runs__in=ids), state__in=Plan.OPEN_STATES)
                     .distinct().prefetch_related("runs").order_by("created_at")):
            for run_id in {plan.run_id, *(covered.pk for covered in plan.runs.all())} & set(ids):
                stories[run_id]["openPlan"] = _plan(plan)
        for plan in Plan.objects.filter(compensation_run_id__in=ids):
            stories[plan.compensation_run_id]["compensates"] = _plan(plan)
        return dict(stories)
