"""Telling people about plans: the approvers when one is ready, the requester when it is decided.

Called from Celery tasks, never inside a transaction. Each channel (email, the webhook) is tried on its own:
one that fails is logged, never stops the other, and is tried again later by the worker
(`approver.retry_notice`, with a growing wait, RETRIES times). The plan itself never depends on a notification
arriving. Header values are made safe first: a tool name is the agent's to choose, and a CR/LF in a subject
would otherwise make the mail library refuse the whole message.
"""

import json
import logging
import re

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail

from journal import visible
from journal.undo.recipe_text import after_the_agent, record_name

from . import authority, execution, planning, sentence
from .content import plan_content, plan_url
from .models import ActionRequest, Approval, ApprovalRules, Plan, PlanItem, RecordLease
from .services import bell, webhooks
from .services.held_calls import action_url
from .services.rest import rest_refusal

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT = 5.0
RETRIES = 5  # after the first attempt; waits of 1, 2, 4, 8 and 16 minutes
FIRST_WAIT = 60.0
SUBJECT_LENGTH = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def header_safe(value: str, limit: int = SUBJECT_LENGTH) -> str:
    """A header value with no line breaks or other control characters (each run becomes one space), cut to
    `limit` characters."""
    cleaned = " ".join(_CONTROL.sub(" ", value).split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def one_line(value: str, limit: int = 300) -> str:
    """An agent's or a server's words (a tool name, a reason) as they go into a message: on one line, so
    they cannot add lines of their own ("Approve or deny: https://…") under ours, and with whatever they hide
    written out and flagged (`journal.visible`)."""
    return header_safe(visible.plain(str(value)), limit)


def slack_escaped(text: str) -> str:
    """Text as Slack reads it literally: `&`, `<` and `>` escaped, so no `<!channel>` or `<url|label>` that an
    agent wrote turns into a mention or a disguised link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(plan: Plan, *, digest: bool = False) -> str:
    """The plan's page; for a message asking for a signature, with the digest it showed (`?digest=`), so the
    page can say if the plan changed since the message was sent."""
    seen = f"?digest={plan.digest[:planning.SHORT_DIGEST]}" if digest and plan.digest else ""
    return f"{settings.PUBLIC_URL.rstrip('/')}{plan_url(plan)}{seen}"


def _digest_line(plan: Plan) -> str:
    return f"Digest: {planning.short_digest(plan.digest)} (whole: {plan.digest})"


def _keep_what_was_sent(plan: Plan) -> None:
    Plan.objects.filter(pk=plan.pk).update(messaged_digest=plan.digest, messaged_content=plan_content(plan))


def summary(plan: Plan) -> str:
    who = one_line(plan.run.agent_name) + (
        f" for {plan.run.agent.on_behalf_of.get_username()}" if plan.run.agent_id else ""
    )
    across = f" {plan.selection_text}, in {plan.runs.count()} runs" if plan.since else ""
    actions = f"{plan.compensate_count} action{'s' if plan.compensate_count != 1 else ''}"
    return (f"Undo {actions} by {who}{across}: "
            f"{plan.cannot_undo_count} cannot be undone, {plan.conflict_count} changed since. "
            f"Asked by {plan.requested_by.get_username()}: “{one_line(plan.reason, 500)}”.")


def signing_will(plan: Plan) -> str:
    """What signing does, in the words the plan's page and JSON use (`approver.sentence`)."""
    items = list(plan.items.select_related("step").order_by("position"))
    return sentence.of_items(items).text(sentence.lead(plan.state))


def _held_lines(plan: Plan) -> str:
    """Each record of the plan another plan holds a lease on: its item waits for that plan."""
    items = list(plan.items.filter(action=PlanItem.Action.COMPENSATE).exclude(record="").select_related(
        "step").order_by("position"))
    held = {(lease.server, lease.resource): lease for lease in RecordLease.objects.held().filter(
        resource__in={i.record for i in items}).exclude(plan=plan).select_related("plan__requested_by")}
    lines = []
    for item in items:
        if (lease := held.get((item.step.server_name, item.record))) is not None:
            asker = lease.plan.requested_by.get_username()
            holder = f"plan {str(lease.plan.public_id)[:8]} (asked for by {asker})"
            lines.append(f"- Step {item.step.number} waits for {holder}, which holds "
                         f"{one_line(record_name(item.record))}.")
    return "Records other plans hold:\n" + "\n".join(lines) + "\n" if lines else ""


UNDO_LINES = 20  # an email lists this many undos; the page has them all


def _undo_lines(plan: Plan) -> str:
    """What signing undoes, in the order it will be done, each as the change it makes ("Put back stage:
    Won → Proposal")."""
    items = list(plan.items.filter(action=PlanItem.Action.COMPENSATE).select_related("step")
                 .order_by("position")[:UNDO_LINES + 1])
    lines = [f"- Step {item.step.number}: {one_line(item.undo_words)}" for item in items[:UNDO_LINES]]
    if len(items) > UNDO_LINES:
        lines.append(f"- and {plan.compensate_count - UNDO_LINES} more: see the plan's page")
    return "Signing undoes, in this order:\n" + "\n".join(lines) + "\n" if lines else ""


def _rest_line(plan: Plan) -> str:
    """For the rest of a plan that stopped short: which, and how it ended."""
    if plan.rest_of_id is None:
        return ""
    first = plan.rest_of
    return (f"This is the rest of plan {str(first.public_id)[:8]}, which stopped short "
            f"({first.get_state_display().lower()}: {one_line(first.execution_summary)}): "
            f"{_link(first)}\n")


def approvers_to_tell(plan: Plan) -> list:
    rules = ApprovalRules.of_plan(plan)
    users = (
        get_user_model().objects.filter(is_active=True, groups__name=rules.approver_role).exclude(email="")
    )
    return [u for u in users.distinct() if not authority.signing_refusal(plan=plan, user=u, rules=rules)]


def changed_since(plan: Plan) -> list[str]:
    """Each record that changed since the agent acted, as a line: what it is, who changed it and when, and
    field by field (before the agent / what it left / now) where its server gave the values."""
    lines = []
    for item in plan.items.filter(action=PlanItem.Action.COMPENSATE, check_status=PlanItem.Check.CONFLICT
                                  ).select_related("step").order_by("position"):
        current = item.check_detail.get("current") or {}
        who = f" by {current['changedBy']}" if current.get("changedBy") else ""
        when = after_the_agent(current.get("changedAt"), item.step.finished_at)
        line = (f"Step {item.step.number}, {item.step.effect_resource or item.step.tool}: changed{who}"
                f"{', ' + when if when else ''}")
        rows = (item.check_detail.get("threeWay") or {}).get("fields")
        if rows:
            line += ". " + "; ".join(
                f"{row['field']}: {row['before']} before the agent, {row['left']} as it left it, "
                f"{row['now']} now" for row in rows)
        elif current.get("fieldsUnreadable"):
            line += ". The server's field values could not be shown."
        elif item.check_detail.get("fieldsGiven") is False:
            line += ". The server gave no field values."
        lines.append("- " + one_line(line, 1000))
    return lines


def plan_event(event: str, plan: Plan, **more) -> int:
    """Tell the webhooks a plan's `event` (`services.webhooks`): what it is, its team, its summary as the
    emails have it, and its page. The tasks call it in the transaction that claims the telling, so the claim
    and the delivery are kept together or not at all."""
    return webhooks.emit(event, {
        "plan": str(plan.public_id), "state": plan.state, "team": plan.run.team.name,
        "agent": plan.run.agent_name, "summary": summary(plan), "digest": plan.digest or None,
        "url": _link(plan), **more}, team_id=plan.run.team_id)


def held_call_event(action: ActionRequest) -> int:
    """Tell the webhooks a held call waits for a human."""
    return webhooks.emit("held_call.waiting", {
        "action": str(action.public_id), "agent": action.agent.name, "team": action.agent.team.name,
        "call": f"{action.server.name}__{action.tool}", "reason": action.reason, "digest": action.digest,
        "expiresAt": action.expires_at.isoformat(), "url": action_url(action)}, team_id=action.agent.team_id)


def plan_ready(plan: Plan) -> int:
    """Email every approver who may sign it, and post to the webhook; returns how many were emailed."""
    changed = changed_since(plan)
    changes = "Changed since the agent acted:\n" + "\n".join(changed) + "\n" if changed else ""
    text = (f"{signing_will(plan)}\n\n{summary(plan)}\n" + _rest_line(plan) + _undo_lines(plan) + changes
            + _held_lines(plan) + f"{_digest_line(plan)}\nReview and sign: {_link(plan, digest=True)}")
    _keep_what_was_sent(plan)
    return _tell_approvers([u.email for u in approvers_to_tell(plan)],
                           f"Undo plan ready for sign-off: {plan.run.agent_name}", text, plan)


def saga_plans_ready(plans: list[Plan]) -> int:
    """One message for the plans saga policies opened after failed calls: each approver is emailed once,
    listing the plans they may sign; the webhook once, listing them all. Returns how many were emailed."""
    for plan in plans:
        _keep_what_was_sent(plan)
    return _digests(plans, approvers_to_tell, _saga_digest, what="saga plans")


def _digests(things: list, readers, digest, *, what: str) -> int:
    """One message per approver for `things` (plans or held calls): each is emailed once, listing those of
    `things` they may decide (`readers(thing)`: the users), in `digest(listed) -> (subject, text)`;
    approvers who may decide the same ones share one message. The webhook hears once, of them all. Returns
    how many messages were emailed."""
    mine: dict[str, list] = {}
    for thing in things:
        for user in readers(thing):
            mine.setdefault(user.email, []).append(thing)
    together: dict[tuple[int, ...], list[str]] = {}
    for address, theirs in mine.items():
        together.setdefault(tuple(thing.pk for thing in theirs), []).append(address)
    by_pk, sent = {thing.pk: thing for thing in things}, 0
    for pks, recipients in together.items():
        subject, text = digest([by_pk[pk] for pk in pks])
        sent += email(subject, text, sorted(recipients), about=f"{len(pks)} {what}")
    if settings.APPROVAL_WEBHOOK_URL and things:
        subject, text = digest(things)
        webhook(slack_escaped(f"{header_safe(subject)}. {text}"), about=f"{len(things)} {what}")
    return sent


def _saga_digest(plans: list[Plan]) -> tuple[str, str]:
    count = len(plans)
    subject = (f"Undo plan ready for sign-off after a failed call: {plans[0].run.agent_name}" if count == 1
               else f"{count} undo plans ready for sign-off after failed calls")
    lines = [f"{summary(plan)}\n{_digest_line(plan)}\nReview and sign: {_link(plan, digest=True)}"
             for plan in plans]
    return subject, "\n\n".join(lines)


def held_calls_requested(actions: list[ActionRequest]) -> int:
    """One message for the held calls nobody was told of yet: each approver is emailed once, listing the
    calls they may decide; the webhook once, listing them all. Returns how many were emailed."""
    users = get_user_model().objects.filter(is_active=True).exclude(email="")

    def readers(action: ActionRequest):
        return [user for user in users.filter(groups__name=action.approver_group).distinct()
                if not authority.action_refusal(action=action, user=user)]

    return _digests(actions, readers, _held_digest, what="held calls")


def _held_digest(actions: list[ActionRequest]) -> tuple[str, str]:
    first = actions[0]
    subject = (f"Held for approval: {first.agent.name} wants {one_line(first.tool, 100)}" if len(actions) == 1
               else f"{len(actions)} calls held for approval")
    return subject, "\n\n".join(_held_lines_of(action) for action in actions)


def _held_lines_of(action: ActionRequest) -> str:
    args = one_line(", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}"
                              for k, v in sorted(action.arguments.items())), 500)
    who = f"{one_line(action.agent.name)} (for {action.agent.on_behalf_of.get_username()})"
    return (f"{who} is waiting to call {one_line(action.server.name)}__{one_line(action.tool)}({args}).\n"
            f"{one_line(action.reason, 500)}\nDigest: {action.digest}\nApprove or deny: {action_url(action)}")


def _tell_approvers(recipients: list[str], subject: str, text: str, about) -> int:
    sent = email(subject, text, recipients, about=str(about)) if recipients else 0
    if settings.APPROVAL_WEBHOOK_URL:
        webhook(slack_escaped(f"{header_safe(subject)}. {text}"), about=str(about))
    return sent


def email(subject: str, text: str, recipients: list[str], *, about: str, attempt: int = 0) -> int:
    """Send one email (its subject made safe); if it fails, log it and have the worker try again later."""
    try:
        return send_mail(header_safe(subject), text, settings.DEFAULT_FROM_EMAIL, recipients)
    except Exception as exc:  # noqa: BLE001 - a channel that fails must not stop another, nor the task
        _failed("email", {"subject": subject, "text": text, "recipients": recipients}, about, attempt, exc)
        return 0


def webhook(text: str, *, about: str, attempt: int = 0) -> bool:
    """Post one message to the approval webhook; if it fails, log it and have the worker try again later."""
    try:
        httpx.post(settings.APPROVAL_WEBHOOK_URL, json={"text": text}, timeout=WEBHOOK_TIMEOUT,
                   follow_redirects=False).raise_for_status()
        return True
    except Exception as exc:  # noqa: BLE001 - as above
        _failed("webhook", {"text": text}, about, attempt, exc)
        return False


def _failed(channel: str, message: dict, about: str, attempt: int, exc: Exception) -> None:
    if attempt >= RETRIES:
        logger.error("gave up on the %s about %s after %d attempts: %s", channel, about, attempt + 1, exc)
        return
    wait = FIRST_WAIT * 2 ** attempt
    logger.warning(
        "the %s about %s failed (%s: %s); trying again in %d s", channel, about, type(exc).__name__, exc, wait
    )
    bell.ring(bell.RETRY_NOTICE, channel, message, about, attempt + 1, countdown=wait)


def retry(channel: str, message: dict, about: str, attempt: int) -> bool:
    """One more attempt at a notification that failed (the worker's `approver.retry_notice`)."""
    if channel == "email":
        return (
            email(message["subject"], message["text"], message["recipients"], about=about, attempt=attempt)
            > 0
        )
    if channel == "webhook" and settings.APPROVAL_WEBHOOK_URL:
        return webhook(message["text"], about=about, attempt=attempt)
    return False


def plan_decided(plan: Plan) -> int:
    """Tell the requester the plan was approved or rejected (with the reason)."""
    if not plan.requested_by.email:
        return 0
    if plan.state == Plan.State.REJECTED:
        rejection = plan.approvals.filter(decision=Approval.Decision.REJECT).order_by("-created_at").first()
        decision = "rejected"
        words = (
            f"rejected by {rejection.approver.get_username()}: “{rejection.reason}”"
            if rejection
            else "rejected"
        )
    else:  # it may be running, or even finished, by the time this is sent
        names = sorted({a.approver.get_username() for a in plan.approvals.filter(
            decision=Approval.Decision.APPROVE, digest=plan.digest).select_related("approver")})
        decision = "approved"
        words = f"approved by {' and '.join(names)}; it may now run" if names else "approved; it may now run"
    return email(f"Your undo plan was {decision}", f"{summary(plan)}\nThe plan was {words}.\n{_link(plan)}",
                 [plan.requested_by.email], about=str(plan))


def plan_executed(plan: Plan) -> int:
    """Tell the requester and everyone who approved what was reversed, and what is left for a human."""
    to_do = list(
        plan.items.filter(outcome__in=execution.NEEDS_A_HUMAN).select_related("step").order_by("position")
    )
    lines = [f"{summary(plan)}", f"Result: {plan.execution_summary}."]
    if plan.stop_reason:
        lines.append(f"Stopped: {plan.stop_reason}")
    for item in to_do:
        words = item.remedy if item.outcome == execution.IRREVERSIBLE and item.remedy else (
            item.outcome_detail or {}).get("message", "")
        lines.append(f"To do by hand, step {item.step.number} ({item.step.tool}): {words}")
    overrides = plan.items.exclude(override_reason="").select_related("step", "override_by")
    for item in overrides.order_by("position"):
        lines.append(f"Override, step {item.step.number} ({item.step.effect_resource or item.step.tool}): "
                     f"{item.override_words}: “{one_line(item.override_reason)}” "
                     f"({item.outcome_words or 'not run'})")
    left = plan.not_yet_undone().count()
    if left and not rest_refusal(plan):
        lines.append(f"{left} undo{'s' if left != 1 else ''} did not take effect: the plan's page offers "
                     "Plan the rest, a new plan for them and what depends on them.")
    lines.append(_link(plan))
    recipients = {
        plan.requested_by.email,
        *plan.approvals.filter(decision=Approval.Decision.APPROVE).values_list("approver__email", flat=True),
    } - {""}
    if not recipients:
        return 0
    return email(f"Undo plan {plan.get_state_display().lower()}: {plan.execution_summary}", "\n".join(lines),
                 sorted(recipients), about=str(plan))
