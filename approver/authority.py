"""Reads of who may do what: who may sign a plan or decide on a held call, which approvals count, who may
press each of a plan's buttons, and the signed decisions a run's exported bundle carries. No writes.

A button's rule is stated once here (the roles and the states it needs); the view's access check, the page
that shows the button and the service that does the work all read it.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from journal.auth import roles, teams
from journal.models import Run

from . import passkeys
from .models import ActionApproval, ActionRequest, Approval, ApprovalRules, Passkey, Plan

# Who may press each button on a plan (the view's `require_role` and the page both read these).
MAY_CHECK = (roles.ON_CALL, roles.APPROVER)
MAY_CANCEL = (roles.ON_CALL, roles.ADMIN)
MAY_CONTROL = (roles.APPROVER, roles.ADMIN)  # pause, resume, abort, and try an unknown outcome again
MAY_SETTLE = (roles.ON_CALL, roles.APPROVER, roles.ADMIN)  # look at an unknown outcome, say how it ended
MAY_PLAN_REST = (roles.ON_CALL, roles.APPROVER)  # ask for a plan of what a finished plan did not undo


@dataclass(frozen=True)
class Control:
    """A button that changes a plan's state: who may press it, and what the page and the API say when it
    did, and when the plan's state did not allow it."""

    allowed: tuple[str, ...]
    done: str
    refused: str

    def refusal(self, plan: Plan) -> str:
        return f"This plan is {plan.get_state_display().lower()}; {self.refused}"


CONTROLS = {
    "cancel": Control(MAY_CANCEL, "Plan cancelled. Its steps can go into a new plan.",
                      "it can no longer be cancelled."),
    "abort": Control(MAY_CONTROL, "Aborted: nothing that has not started will run.",
                     "there is nothing to abort."),
    "pause": Control(MAY_CONTROL,
                     "Paused: the item in flight finishes, nothing else starts until you resume.",
                     "it cannot be paused."),
    "resume": Control(MAY_CONTROL, "Resumed: the approvals are checked again before each item.",
                      "there is nothing to resume."),
}


def visible_plans(user, plans: QuerySet | None = None) -> QuerySet:
    """`plans` (default: every plan) narrowed to those of the teams `user` may see: a plan is its run's
    team's (a plan since a moment covers one agent's runs, all in its team)."""
    plans = Plan.objects.all() if plans is None else plans
    return plans if teams.sees_every_team(user) else plans.filter(run__team_id__in=teams.team_ids(user))


def visible_plan(request, plan_id, plans: QuerySet | None = None) -> Plan:
    """The plan `plan_id` if the signed-in person's teams reach it; another team's is "no such plan", word for
    word as one that does not exist."""
    plan = visible_plans(request.user, plans).filter(public_id=plan_id).first()
    if plan is None:
        raise Http404("No such plan among those you may see.")
    return plan


def visible_actions(user, actions: QuerySet | None = None) -> QuerySet:
    """`actions` (held calls; default: every one) narrowed to the teams `user` may see."""
    actions = ActionRequest.objects.all() if actions is None else actions
    return actions if teams.sees_every_team(user) else actions.filter(
        agent__team_id__in=teams.team_ids(user))


def visible_action(request, action_id, actions: QuerySet | None = None) -> ActionRequest:
    action = visible_actions(request.user, actions).filter(public_id=action_id).first()
    if action is None:
        raise Http404("No such held call among those you may see.")
    return action


def plan_buttons(user, plan: Plan) -> dict[str, bool]:
    """Which of the plan's buttons `user` may press now: their roles, and the plan's state."""
    running = not plan.stop_reason
    return {
        "may_check": roles.has_any_role(user, *MAY_CHECK) and plan.state in Plan.CHECKABLE_STATES,
        "may_cancel": roles.has_any_role(user, *MAY_CANCEL) and plan.state in Plan.CANCELLABLE_STATES,
        "may_abort": roles.has_any_role(user, *MAY_CONTROL)
        and plan.state in Plan.STOPPABLE_STATES
        and running,
        "may_pause": roles.has_any_role(user, *MAY_CONTROL)
        and plan.state in Plan.RUNNABLE_STATES
        and running,
        "may_resume": roles.has_any_role(user, *MAY_CONTROL) and plan.state == Plan.State.PAUSED and running,
        "may_settle": roles.has_any_role(user, *MAY_SETTLE) and plan.state in Plan.FINISHED_STATES,
        "may_plan_rest": roles.has_any_role(user, *MAY_PLAN_REST) and plan.state in Plan.FINISHED_STATES,
        "may_retry": roles.has_any_role(user, *MAY_CONTROL)
        and plan.state in Plan.FINISHED_STATES
        and running,
    }


NO_PASSKEY = "no-passkey"  # the refusal the sign-off form turns into a link to enrol one


def signing_state(user, *, role: str, refusal) -> dict[str, Any]:
    """Whether `user` may sign now (`may_sign`), and if not why (`sign_refusal`), for a plan or a held call:
    written once for both. Someone outside `role` is told that signing is not theirs; `refusal`
    is the subject's own rule (a callable giving "" when it lets them), or None when there is nothing to
    sign now; with no active passkey, the refusal is NO_PASSKEY."""
    if refusal is None:
        return {"may_sign": False, "sign_refusal": ""}
    if not roles.has_role(user, role):  # say why there is no button, rather than leave it missing
        return {"may_sign": False, "sign_refusal": f"Signing is for {roles.in_words(role)}, and you are not "
                                                   "one: there is nothing for you to sign here."}
    why = refusal() or ("" if Passkey.objects.active().filter(user=user).exists() else NO_PASSKEY)
    return {"may_sign": not why, "sign_refusal": why}


def signing_refusal(*, plan: Plan, user, rules: ApprovalRules | None = None) -> str:
    """Why `user` may not approve or reject `plan` (role, team, separation of duties), or "" if they may. A
    plan's approvers are its team's: admins who see every team sign only for the teams they are in."""
    rules = rules or ApprovalRules.of_plan(plan)
    if not user.is_active or not roles.has_role(user, rules.approver_role):
        return f"Only {roles.in_words(rules.approver_role)} may approve or reject plans."
    if plan.run.team_id not in teams.team_ids(user):
        return (f"Only {roles.in_words(rules.approver_role)} of the team {plan.run.team} may approve or "
                "reject this plan, and you are not in it.")
    if rules.separation_of_duties:
        if user.pk == plan.requested_by_id:
            return "You asked for this plan, so someone else must approve it (separation of duties)."
        if user.pk in _asked_earlier(plan):
            return ("You asked for the undo this plan is the rest of, so someone else must approve it "
                    "(separation of duties).")
        agent = plan.run.agent
        if agent is not None and user.pk == agent.on_behalf_of_id:
            return "The agent acted for you, so someone else must approve undoing it (separation of duties)."
    return ""


def _asked_earlier(plan: Plan) -> set[int]:
    """Who asked for the plans this one is the rest of (Plan the rest, however many times over)."""
    asked, first, seen = set(), plan.rest_of, {plan.pk}
    while first is not None and first.pk not in seen:
        seen.add(first.pk)
        asked.add(first.requested_by_id)
        first = first.rest_of
    return asked


def who_may_sign(plan: Plan, rules: ApprovalRules | None = None) -> list:
    """Everyone who may approve or reject `plan` now (in the role, active, not barred by separation of
    duties), whether or not they have an email address."""
    rules = rules or ApprovalRules.of_plan(plan)
    users = get_user_model().objects.filter(is_active=True, groups__name=rules.approver_role).distinct()
    return [u for u in users.order_by("username") if not signing_refusal(plan=plan, user=u, rules=rules)]


def counting_approvals(
    *, plan: Plan, now: datetime | None = None, rules: ApprovalRules | None = None
) -> list[Approval]:
    """The approvals that count now, one per approver: of the plan's current content, not expired, by someone
    who still may approve (active, in the role, not barred by separation of duties) with a passkey that is
    not revoked. Execution asks again before it starts, so lost authority is never counted."""
    now = now or timezone.now()
    rules = rules or ApprovalRules.of_plan(plan)
    counted: dict[int, Approval] = {}
    for approval in (
        plan.approvals.filter(
            decision=Approval.Decision.APPROVE,
            digest=plan.digest,
            expires_at__gt=now,
            passkey__revoked_at__isnull=True,
        )
        .select_related("approver", "passkey")
        .order_by("created_at")
    ):
        if approval.approver_id in counted or signing_refusal(plan=plan, user=approval.approver, rules=rules):
            continue
        counted[approval.approver_id] = approval
    return list(counted.values())


def signed_already(*, plan: Plan, user, now: datetime | None = None,
                   rules: ApprovalRules | None = None) -> Approval | None:
    """`user`'s approval of `plan` as it is now, while it counts: a second signature of the same content
    would count for nothing, so none is taken."""
    return next((approval for approval in counting_approvals(plan=plan, now=now, rules=rules)
                 if approval.approver_id == user.pk), None)


def waiting_for(user, *, limit: int) -> tuple[list[Plan], bool]:
    """The plans ready for sign-off that `user` may sign and has not, newest first, up to `limit` (and
    whether there may be more): the nav counts them, and an approver lands on them."""
    if not roles.has_role(user, roles.APPROVER):
        return [], False
    ready = list(Plan.objects.filter(state=Plan.State.READY, run__team_id__in=teams.team_ids(user))
                 .select_related("run__agent", "run__team", "requested_by")
                 .order_by("-updated_at")[:limit + 1])
    mine = [plan for plan in ready[:limit] if not signing_refusal(plan=plan, user=user)
            and signed_already(plan=plan, user=user) is None]
    return mine, len(ready) > limit


def signed_words(approval: Approval, *, still_needed: int, names: list[str], chose: list[str] = ()) -> str:
    """What an approver whose approval counts is told instead of a sign button: that they signed, when and
    with which choices (`chose`, in words), and what the plan still needs, from whom."""
    if still_needed <= 0:
        needs = "It has every approval it needs."
    else:
        needs = (f"It needs {still_needed} more approval{'s' if still_needed != 1 else ''}, from "
                 f"{', '.join(names) if names else 'nobody who may sign now'}.")
    at = timezone.localtime(approval.created_at).strftime("%b %-d, %H:%M %Z")
    choices = f", choosing: {'; '.join(chose)}" if chose else ""
    return f"You approved this plan as it is now, on {at}{choices}. {needs}"


def approvals_for_bundle(run: Run) -> list[dict[str, Any]]:  # the journal's `signed_decisions` port
    """Every signed decision on the plans covering the run (a plan since a moment covers several) and on its
    held calls, with what an offline verifier needs: the fields the challenge was derived from, the assertion
    and the passkey's public key (SubjectPublicKeyInfo)."""

    def signed(approval, fields: dict[str, Any]) -> dict[str, Any]:
        response = approval.assertion.get("response", {}) if isinstance(approval.assertion, dict) else {}
        return {
            **fields,
            "approver": approval.approver.get_username(),
            "decision": approval.decision,
            "digest": approval.digest,
            "nonce": approval.nonce,
            "reason": approval.reason or None,
            "createdAt": approval.created_at.isoformat(),
            "credentialId": approval.passkey.credential_id,
            "publicKey": passkeys.spki(approval.passkey.public_key),
            "assertion": {
                key: response.get(key) for key in ("clientDataJSON", "authenticatorData", "signature")
            },
        }

    bundle = [
        signed(
            a, {"plan": str(a.plan.public_id), "choices": a.choices,
                **({"overrides": a.overrides} if a.overrides else {}), "expiresAt": a.expires_at.isoformat()}
        )
        for a in (
            Approval.objects.filter(Q(plan__run=run) | Q(plan__runs=run)).distinct()
            .select_related("plan", "approver", "passkey")
            .order_by("created_at", "pk")
        )
    ]
    bundle += [
        signed(a, {"action": str(a.request.public_id)})
        for a in (
            ActionApproval.objects.filter(request__run=run)
            .select_related("request", "approver", "passkey")
            .order_by("created_at", "pk")
        )
    ]
    return bundle


def counting_action_approvals(
    *, action: ActionRequest, rules: ApprovalRules | None = None
) -> list[ActionApproval]:
    """The approvals of a held call that count now, one per approver: of its exact content, with a passkey
    that is not revoked, by someone still active, in the deciding group and the agent's team, and not the
    agent's own person."""
    rules = rules or ApprovalRules.current(action.agent.team_id)
    counted: dict[int, ActionApproval] = {}
    for approval in (action.approvals.filter(decision=ActionApproval.Decision.APPROVE, digest=action.digest,
                                             passkey__revoked_at__isnull=True)
                     .select_related("approver", "passkey").order_by("created_at")):
        approver = approval.approver
        if (
            approval.approver_id in counted
            or not approver.is_active
            or not roles.has_role(approver, action.approver_group)
            or action.agent.team_id not in teams.team_ids(approver)
        ):
            continue
        if rules.separation_of_duties and action.agent.on_behalf_of_id == approver.pk:
            continue
        counted[approval.approver_id] = approval
    return list(counted.values())


def action_refusal(*, action: ActionRequest, user) -> str:
    """Why `user` may not decide on this held call now, or "" if they may."""
    if action.state != ActionRequest.State.PENDING:
        return f"This call is {action.get_state_display().lower()}; there is nothing to decide."
    if not roles.has_role(user, action.approver_group):
        return f"Only {roles.in_words(action.approver_group)} decide on held calls."
    if action.agent.team_id not in teams.team_ids(user):
        return (f"Only {roles.in_words(action.approver_group)} of the team {action.agent.team} decide on "
                "its agents' calls, and you are not in it.")
    if (ApprovalRules.current(action.agent.team_id).separation_of_duties
            and action.agent.on_behalf_of_id == user.pk):
        return "The agent acts for you, so someone else must decide on its calls."
    if action.approvals.filter(approver=user).exists():
        return "You have already decided on this call."
    return ""

