"""Telling people about plans: the approvers when one is ready, the requester when it is decided.

Called from Celery tasks, never inside a transaction. A mail server or webhook that fails is logged and
does not stop the other channel; the plan itself never depends on a notification arriving.
"""

import logging

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail

from . import authority, execution
from .content import plan_url
from .models import ActionRequest, Approval, ApprovalRules, Plan
from .services.held_calls import action_url

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT = 5.0


def _link(plan: Plan) -> str:
    return f"{settings.PUBLIC_URL.rstrip('/')}{plan_url(plan)}"


def summary(plan: Plan) -> str:
    who = plan.run.agent_name + (f" for {plan.run.agent.on_behalf_of.get_username()}" if plan.run.agent_id else "")
    return (f"Undo {plan.compensate_count} action{'s' if plan.compensate_count != 1 else ''} by {who}: "
            f"{plan.cannot_undo_count} cannot be undone, {plan.conflict_count} changed since. "
            f"Asked by {plan.requested_by.get_username()}: “{plan.reason}”.")


def approvers_to_tell(plan: Plan) -> list:
    rules = ApprovalRules.current()
    users = get_user_model().objects.filter(is_active=True, groups__name=rules.approver_role).exclude(email="")
    return [u for u in users.distinct() if not authority.signing_refusal(plan=plan, user=u, rules=rules)]


def plan_ready(plan: Plan) -> int:
    """Email every approver who may sign it, and post to the webhook; returns how many were emailed."""
    text = f"{summary(plan)}\nReview and sign: {_link(plan)}"
    return _tell_approvers([u.email for u in approvers_to_tell(plan)],
                           f"Undo plan ready for sign-off: {plan.run.agent_name}", text, plan)


def action_requested(action: ActionRequest) -> int:
    """Email the held call's approvers and post to the webhook: an agent is waiting."""
    users = get_user_model().objects.filter(is_active=True, groups__name=action.approver_group).exclude(email="")
    recipients = [u.email for u in users.distinct() if not authority.action_refusal(action=action, user=u)]
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(action.arguments.items()))[:500]
    text = (f"{action.agent.name} (for {action.agent.on_behalf_of.get_username()}) is waiting to call "
            f"{action.server.name}__{action.tool}({args}).\n{action.reason}\nApprove or deny: "
            f"{action_url(action)}")
    return _tell_approvers(recipients, f"Held for approval: {action.agent.name} wants {action.tool}", text, action)


def _tell_approvers(recipients: list[str], subject: str, text: str, about) -> int:
    sent = 0
    if recipients:
        try:
            sent = send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, recipients)
        except OSError:
            logger.exception("could not email the approvers of %s", about)
    if settings.APPROVAL_WEBHOOK_URL:
        try:
            httpx.post(settings.APPROVAL_WEBHOOK_URL, json={"text": f"{subject}. {text}"},
                       timeout=WEBHOOK_TIMEOUT).raise_for_status()
        except httpx.HTTPError:
            logger.exception("the approval webhook refused or did not answer for %s", about)
    return sent


def plan_decided(plan: Plan) -> int:
    """Tell the requester the plan was approved or rejected (with the reason)."""
    if not plan.requested_by.email:
        return 0
    if plan.state == Plan.State.REJECTED:
        rejection = plan.approvals.filter(decision=Approval.Decision.REJECT).order_by("-created_at").first()
        decision = "rejected"
        words = f"rejected by {rejection.approver.get_username()}: “{rejection.reason}”" if rejection else "rejected"
    else:  # it may be running, or even finished, by the time this is sent
        names = sorted({a.approver.get_username() for a in plan.approvals.filter(
            decision=Approval.Decision.APPROVE, digest=plan.digest).select_related("approver")})
        decision = "approved"
        words = f"approved by {' and '.join(names)}; it may now run" if names else "approved; it may now run"
    try:
        return send_mail(f"Your undo plan was {decision}",
                         f"{summary(plan)}\nThe plan was {words}.\n{_link(plan)}",
                         settings.DEFAULT_FROM_EMAIL, [plan.requested_by.email])
    except OSError:
        logger.exception("could not email the requester of %s", plan)
        return 0


def plan_executed(plan: Plan) -> int:
    """Tell the requester and everyone who approved what was reversed, and what is left for a human."""
    to_do = list(plan.items.filter(outcome__in=execution.NEEDS_A_HUMAN).select_related("step").order_by("position"))
    lines = [f"{summary(plan)}", f"Result: {plan.execution_summary}."]
    if plan.stop_reason:
        lines.append(f"Stopped: {plan.stop_reason}")
    for item in to_do:
        words = item.remedy if item.outcome == execution.IRREVERSIBLE and item.remedy else (
            item.outcome_detail or {}).get("message", "")
        lines.append(f"To do by hand, step {item.step.number} ({item.step.tool}): {words}")
    lines.append(_link(plan))
    recipients = {plan.requested_by.email, *plan.approvals.filter(decision=Approval.Decision.APPROVE).values_list(
        "approver__email", flat=True)} - {""}
    if not recipients:
        return 0
    try:
        return send_mail(f"Undo plan {plan.get_state_display().lower()}: {plan.execution_summary}", "\n".join(lines),
                         settings.DEFAULT_FROM_EMAIL, sorted(recipients))
    except OSError:
        logger.exception("could not email the result of %s", plan)
        return 0
