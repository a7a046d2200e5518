"""The API's reversal plans: ask for one (from step N, chosen steps, or since a moment), read it with its
summary, checks, approvals and report, and pause, resume, abort or cancel it: what on-call does in the
browser, for a script or an incident tool. Signing stays in the browser with a passkey.

A router of the one API (`approver.web_api`); same access rules as the pages (the buttons' roles in
`approver.authority`, within the person's teams). Read a plan's content exactly as it is digested:
SHA-256 of the RFC 8785 (JCS) bytes of `content` equals `digest`.
"""

from datetime import datetime
from typing import Any

from django.http import HttpRequest, QueryDict
from django.urls import reverse
from ninja import Field, Router, Schema, Status
from ninja.errors import HttpError

from journal.api import Moment, PublicId, page_of
from journal.auth import roles
from journal.auth.access import READERS, require_role, visible_agent, visible_run

from . import authority, execution, notifications, planning, sentence
from .forms import UndoRequestForm
from .models import Approval, ApprovalRules, PersonalToken, Plan, PlanItem, RecordLease
from .services import (
    PlanRefused,
    abort_plan,
    ask_for_plan,
    ask_to_undo_since,
    cancel_plan,
    live_rest,
    pause_plan,
    plan_content,
    plan_url,
    resume_plan,
)

router = Router(tags=["Reversal plans"])


class FromRun(Schema):
    fromStep: int | None = Field(None, ge=1, description="Undo this step and every one after it.")
    steps: list[int] | None = Field(None, description="Or undo these steps (and what depends on them).")
    reason: str = Field(description="Why: the approvers read it.")


class Since(Schema):
    since: datetime = Field(description="The moment, ISO 8601 with its offset: all the agent did since.")
    reason: str = Field(description="Why: the approvers read it.")


class Refusal(Schema):
    error: str
    openPlan: str | None = Field(None, description="The open plan that already holds those steps.")


class PlanBrief(Schema):
    id: PublicId
    state: str
    agent: str
    team: str
    selection: str
    requestedBy: str
    createdAt: Moment
    url: str


class PlanPage(Schema):
    items: list[PlanBrief]
    page: int
    pages: int
    count: int
    next: str | None


class PlanOut(Schema):
    """A plan as on its page. `content` and `digest` are what approvers sign."""

    id: PublicId
    state: str
    team: str
    url: str
    summary: str = Field(description="The plan in one paragraph, as the approvers' email has it.")
    checks: dict[str, Any]
    digest: str
    content: dict[str, Any]
    restOf: str | None
    rest: str | None
    sentence: dict[str, Any] | None = Field(description="What signing does (null while it is drafted).")
    undo: list[dict[str, Any]]
    leases: list[dict[str, Any]]
    overrides: list[dict[str, Any]]
    approvals: dict[str, Any] = Field(description="Who signed, what counts, and how many more are needed.")
    report: dict[str, Any] | None = Field(description="What each item did (null until it starts).")


def _brief(plan: Plan) -> dict[str, Any]:
    return {"id": str(plan.public_id), "state": plan.state, "agent": plan.run.agent_name,
            "team": plan.run.team.name, "selection": plan.selection_text,
            "requestedBy": plan.requested_by.get_username(), "createdAt": plan.created_at.isoformat(),
            "url": plan_url(plan)}


@router.get("/plans/", response=PlanPage, url_name="plan_list", summary="Plans, newest first")
def plan_list(request, page: int = 1, state: str = ""):
    require_role(request, *READERS)
    plans = authority.visible_plans(request.user, Plan.objects.for_page()).order_by("-created_at", "-id")
    if state:
        plans = plans.filter(state=state)
    return page_of(plans, _brief, reverse("api:plan_list"), page)


@router.post("/runs/{uuid:run_id}/plans/", response={201: PlanOut, 409: Refusal}, url_name="ask_from_run",
             summary="Ask for a plan undoing a run from step N, or chosen steps")
def ask_from_run(request, run_id, body: FromRun):
    """As the run page's Undo button: the plan opens at once (`drafting`); the worker drafts it and checks
    every step with the tool servers. Read it again until `state` is `ready`."""
    _writes(request)
    require_role(request, roles.ON_CALL)
    run = visible_run(request, run_id)
    asked = _cleaned(body)
    try:
        plan = ask_for_plan(run=run, requested_by=request.user, reason=asked["reason"],
                            from_step=asked["from_step"], steps=asked["steps"] or None)
    except PlanRefused as refused:
        return Status(409, _refusal(refused))
    return Status(201, plan_json(_fresh(plan)))


@router.post("/agents/{slug:name}/plans/", response={201: PlanOut, 409: Refusal}, url_name="ask_since",
             summary="Ask for a plan undoing everything an agent did since a moment")
def ask_since(request, name: str, body: Since):
    _writes(request)
    require_role(request, roles.ON_CALL)
    agent = visible_agent(request, name)
    if body.since.tzinfo is None:
        raise HttpError(422, "Give `since` with its offset (2026-12-02T03:10:00+01:00, or Z for UTC).")
    if not body.reason.strip():
        raise HttpError(422, "Say why this should be undone: the approver reads it.")
    try:
        plan = ask_to_undo_since(agent=agent, since=body.since, requested_by=request.user,
                                 reason=body.reason.strip())
    except PlanRefused as refused:
        return Status(409, _refusal(refused))
    return Status(201, plan_json(_fresh(plan)))


@router.get("/plans/{uuid:plan_id}/", response=PlanOut, url_name="plan_detail", summary="One plan")
def plan_detail(request, plan_id):
    require_role(request, *READERS)
    return plan_json(authority.visible_plan(request, plan_id, Plan.objects.for_page()))


def _control(request, plan_id, name: str, action):
    """The page's button `name` (`authority.CONTROLS`: who may, and the words of a refusal), as JSON."""
    control = authority.CONTROLS[name]
    _writes(request)
    require_role(request, *control.allowed)
    plan = authority.visible_plan(request, plan_id)
    if not action(plan=plan, by=request.user):
        return Status(409, {"error": control.refusal(plan)})
    return Status(200, plan_json(_fresh(plan)))


@router.post("/plans/{uuid:plan_id}/pause/", response={200: PlanOut, 409: Refusal}, url_name="pause",
             summary="Pause an executing plan after the item in flight")
def pause(request, plan_id):
    return _control(request, plan_id, "pause", pause_plan)


@router.post("/plans/{uuid:plan_id}/resume/", response={200: PlanOut, 409: Refusal}, url_name="resume",
             summary="Resume a paused plan (its approvals are checked again before each item)")
def resume(request, plan_id):
    return _control(request, plan_id, "resume", resume_plan)


@router.post("/plans/{uuid:plan_id}/abort/", response={200: PlanOut, 409: Refusal}, url_name="abort",
             summary="Abort a plan: the item in flight finishes, nothing after it starts")
def abort(request, plan_id):
    return _control(request, plan_id, "abort", abort_plan)


@router.post("/plans/{uuid:plan_id}/cancel/", response={200: PlanOut, 409: Refusal}, url_name="cancel",
             summary="Cancel a plan nobody approved yet, freeing its steps")
def cancel(request, plan_id):
    return _control(request, plan_id, "cancel", cancel_plan)


def _writes(request: HttpRequest) -> None:
    """A token made to read only may not change anything (a session may, as its person may)."""
    token = getattr(request, "auth", None)
    if isinstance(token, PersonalToken) and token.scope != PersonalToken.Scope.UNDO:
        raise HttpError(403, "This token may only read: make one with the undo scope to ask for or control "
                             "plans.")


def _cleaned(body: FromRun) -> dict[str, Any]:
    """The request checked as the run page's form checks it: the same limits, the same words."""
    data = QueryDict(mutable=True)
    if body.fromStep is not None:
        data["from_step"] = str(body.fromStep)
    data.setlist("steps", [str(n) for n in body.steps or []])
    data["reason"] = body.reason
    form = UndoRequestForm(data)
    if not form.is_valid():
        raise HttpError(422, " ".join(str(e) for errors in form.errors.values() for e in errors))
    return form.cleaned_data


def _refusal(refused: PlanRefused) -> dict[str, Any]:
    return {"error": refused.message,
            "openPlan": str(refused.open_plan.public_id) if refused.open_plan else None}


def _fresh(plan: Plan) -> Plan:
    return Plan.objects.for_page().get(pk=plan.pk)


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as the API gives it: its page's facts, each from the function the page reads."""
    content = plan_content(plan)
    items = list(plan.items.select_related("step").order_by("position"))
    # While checks run, the content moves with every answer; once the plan is ready, its digest is this one.
    return {
        "id": str(plan.public_id),
        "state": plan.state,
        "team": plan.run.team.name,
        "url": plan_url(plan),
        "summary": notifications.summary(plan),
        "checks": {"total": plan.checks_total, "done": plan.checks_done,
                   "items": [{"item": i.position, "step": i.step.number, "status": i.check_status or None}
                             for i in items if i.action == PlanItem.Action.COMPENSATE]},
        "digest": planning.digest(content),
        "content": content,
        # Plan the rest: the plan this one takes up, and where this one's rest went
        "restOf": str(plan.rest_of.public_id) if plan.rest_of_id else None,
        "rest": str(rest.public_id) if (rest := live_rest(plan)) else None,
        # What signing does, in the words the page and the approvers' email use (approver.sentence)
        "sentence": sentence.of_items(items).as_json(sentence.lead(plan.state)) if plan.digest else None,
        # What each undo does, as the change it makes to the record (not signed: the content has the call)
        "undo": [{"item": item.position, "does": item.undo_words} for item in items
                 if item.action == PlanItem.Action.COMPENSATE],
        # Its leases on the records it will change: held, or waiting in line behind the plan that holds it
        "leases": [_lease_json(lease) for lease in plan.leases.open().order_by("asked_at", "id")],
        # Who asked for each override and when (its reason is in the content, signed)
        "overrides": [
            {"item": item.position, "by": item.override_by.get_username() if item.override_by else None,
             "at": item.override_at.isoformat() if item.override_at else None, "reason": item.override_reason}
            for item in plan.items.exclude(override_reason="").select_related("override_by")
            .order_by("position")
        ],
        "approvals": _approvals_json(plan),
        "report": _report_json(plan, items),
    }


def _approvals_json(plan: Plan) -> dict[str, Any]:
    """Who signed what and when, which signatures count now (of this content, unexpired, by someone who still
    may), and how many more the team's rules need, from whom: the sign-off box's own reads."""
    rules = ApprovalRules.of_plan(plan)
    counting = {a.pk for a in authority.counting_approvals(plan=plan, rules=rules)}
    signed = [{"by": a.approver.get_username(), "decision": a.decision, "at": a.created_at.isoformat(),
               "expiresAt": a.expires_at.isoformat(), "digest": a.digest, "counts": a.pk in counting,
               "reason": a.reason or None}
              for a in plan.approvals.select_related("approver").order_by("created_at", "pk")]
    still = max(rules.quorum - len(counting), 0) if plan.state == Plan.State.READY else 0
    approved = set(plan.approvals.filter(digest=plan.digest, decision=Approval.Decision.APPROVE)
                   .values_list("approver_id", flat=True)) if still else set()
    return {"quorum": rules.quorum, "counted": len(counting), "stillNeeded": still,
            "mayStillSign": [u.get_username() for u in authority.who_may_sign(plan, rules)
                             if u.pk not in approved] if still else [],
            "signed": signed}


def _report_json(plan: Plan, items: list[PlanItem]) -> dict[str, Any] | None:
    """What each item did, as the plan's report says it: null until the plan starts executing."""
    if plan.state not in (Plan.State.EXECUTING, Plan.State.PAUSED, *Plan.FINISHED_STATES):
        return None
    return {
        "summary": plan.execution_summary or None,
        "finished": plan.state in Plan.FINISHED_STATES,
        "items": [{
            "item": item.position, "step": item.step.number, "tool": item.step.tool,
            "server": item.step.server_name, "action": item.action,
            "state": item.exec_state or "not started",
            "outcome": item.outcome or None, "outcomeWords": item.outcome_words or None,
            "message": (item.outcome_detail or {}).get("message") or None,
            "attempts": item.attempts,
            "startedAt": item.exec_started_at.isoformat() if item.exec_started_at else None,
            "finishedAt": item.exec_finished_at.isoformat() if item.exec_finished_at else None,
            "needsAPerson": item.outcome in execution.NEEDS_A_HUMAN,
        } for item in items],
    }


def _lease_json(lease: RecordLease) -> dict:
    holder = None if lease.is_held else RecordLease.objects.held().filter(
        server=lease.server, resource=lease.resource).select_related("plan").first()
    return {"server": lease.server, "resource": lease.resource, "held": lease.is_held,
            "since": lease.held_since.isoformat() if lease.held_since else None,
            "until": lease.until.isoformat() if lease.until else None, "askedAt": lease.asked_at.isoformat(),
            "heldBy": str(holder.plan.public_id) if holder else None}

