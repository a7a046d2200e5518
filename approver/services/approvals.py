"""Signed decisions: one passkey ceremony for a plan (approve or reject) and for a held call (approve or
deny), and the transitions those decisions make.

The ceremony has two halves. `_issue` hands the signer's browser a one-time challenge derived from exactly
what they decide on (the plan's digest with their conflict choices, or the held call's digest), kept as a
`SigningRequest`. `_redeem` uses its nonce up whatever happens next, lets the subject say whether it still
stands as it was, and checks the assertion against one of the signer's active passkeys. Only then is the
decision kept, under the subject's row lock.
"""

import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url

from journal import services as journal_services

from .. import passkeys, planning, signing, traced
from ..authority import action_refusal, counting_approvals, signed_already, signing_refusal
from ..content import conflict_positions, plan_content
from ..models import (
    ActionApproval,
    ActionRequest,
    Approval,
    ApprovalRules,
    Passkey,
    Plan,
    PlanItem,
    SigningRequest,
)
from . import bell, following, leases, webhooks

SIGNING_SECONDS = passkeys.CHALLENGE_SECONDS  # how long a challenge waits for the signer's passkey

# A decision on a held call that cannot be taken is refused like a plan's signature: `message` says why.
ActionRefused = signing.SigningRefused


# -- the ceremony --------------------------------------------------------------------------------------------


def _signing_keys(user, *, none_words: str) -> list[str]:
    keys = list(Passkey.objects.active().filter(user=user).values_list("credential_id", flat=True))
    if not keys:
        raise signing.SigningRefused(none_words)
    return keys


def _issue(*, user, keys: list[str], decision: str, reason: str, payload: Callable[[str], dict[str, Any]],
           now: datetime, **subject) -> tuple[SigningRequest, str]:
    """A one-time challenge over `payload(nonce)`, kept with what it is about, and the browser's options."""
    nonce = secrets.token_urlsafe(24)
    challenge = signing.challenge(payload(nonce))
    request = SigningRequest.objects.create(
        user=user, nonce=nonce, decision=decision, reason=reason, challenge=bytes_to_base64url(challenge),
        created_at=now, expires_at=now + timedelta(seconds=SIGNING_SECONDS), **subject)
    return request, passkeys.authentication_options(
        rp=passkeys.this_site(), challenge=challenge, credential_ids=keys
    )


def _redeem(*, user, nonce: str, credential: Any, about: str, still_stands: Callable[[SigningRequest], Any],
            now: datetime, subject=None) -> tuple[SigningRequest, Any, Passkey, int]:
    """Use up the nonce (a conditional update: it can be redeemed once, whatever happens next), ask the
    subject whether it still stands as it was signed (`still_stands(request)` returns what the caller needs,
    or raises), and check the assertion. Returns the request, that answer, the passkey and its new count.
    Given `subject` (the plan or held call whose page signs), a nonce issued for another is refused and
    left as it was: a signature is completed only where it began."""
    nonce = str(nonce)[:64]
    mine = SigningRequest.objects.filter(nonce=nonce, user=user)
    if subject is not None and mine.exclude(**{about: subject}).exists():
        raise signing.SigningRefused(
            f"This signature was begun on another {_SUBJECT_WORDS[about]}; nothing was "
            "signed. Start again on this page."
        )
    if not mine.filter(**({about: subject} if subject is not None else {f"{about}__isnull": False}),
                       used_at__isnull=True, expires_at__gt=now).update(used_at=now):
        raise signing.SigningRefused("This signing request is unknown, already used or expired; start again.")
    request = SigningRequest.objects.get(nonce=nonce)
    answer = still_stands(request)
    passkey = (
        Passkey.objects.active()
        .filter(user=user, credential_id=passkeys.credential_id_of(credential))
        .first()
    )
    if passkey is None:
        raise signing.SigningRefused("That passkey is not one of your active passkeys.")
    try:
        new_count = passkeys.verify_assertion(rp=passkeys.this_site(), credential=credential,
                                              challenge=base64url_to_bytes(request.challenge),
                                              public_key=passkey.public_key, sign_count=passkey.sign_count)
    except passkeys.PasskeyRefused as refused:
        raise signing.SigningRefused(refused.message) from None
    return request, answer, passkey, new_count


_SUBJECT_WORDS = {"plan": "plan", "action": "held call"}


def _keep_passkey_use(passkey: Passkey, new_count: int, now: datetime) -> None:
    Passkey.objects.filter(pk=passkey.pk).update(sign_count=new_count, last_used_at=now)


# -- plans ---------------------------------------------------------------------------------------------------


def begin_signing(*, plan: Plan, user, decision: str, choices: Any = None, overrides: Any = None,
                  reason: str = "", now: datetime | None = None) -> tuple[SigningRequest, str]:
    """A one-time challenge for `user` to approve or reject `plan` as it is now, with their conflict
    choices and why they overwrite where they do (`overrides`), and the options for their browser.
    SigningRefused says why not."""
    now = now or timezone.now()
    plan = Plan.objects.select_related("run__agent", "requested_by").get(pk=plan.pk)
    if decision not in signing.DECISIONS:
        raise signing.SigningRefused("Approve or reject.")
    if plan.state != Plan.State.READY:
        raise signing.SigningRefused(f"The plan is {plan.get_state_display().lower()}; only a plan ready for "
                                     "sign-off can be approved or rejected.")
    refusal = signing_refusal(plan=plan, user=user)
    if refusal:
        raise signing.SigningRefused(refusal)
    if decision == signing.APPROVE and signed_already(plan=plan, user=user, now=now) is not None:
        raise signing.SigningRefused("You approved this plan as it is now already: a second signature of "
                                     "the same content would count for nothing.")
    reason = (reason or "").strip()
    if decision == signing.REJECT and not reason:
        raise signing.SigningRefused("Say why you reject the plan: the requester reads it.")
    keys = _signing_keys(user, none_words="Enrol a passkey first: approvals are signed with it.")
    choices = signing.clean_choices(choices, conflicts=conflict_positions(plan), decision=decision)
    overrides = signing.clean_overrides(overrides, choices=choices, decision=decision)
    digest = planning.digest(plan_content(plan, choices=choices if decision == signing.APPROVE else None,
                                          overrides=overrides))
    return _issue(
        user=user,
        keys=keys,
        decision=decision,
        reason=reason,
        now=now,
        plan=plan,
        choices=choices,
        overrides=overrides,
        digest=digest,
        payload=lambda nonce: signing.challenge_payload(
            plan=str(plan.public_id), digest=digest, decision=decision, choices=choices, nonce=nonce
        ),
    )


def complete_signing(*, user, nonce: str, credential: Any, plan: Plan | None = None,
                     now: datetime | None = None) -> Approval:
    """Keep the approver's signed decision, once the assertion holds and the plan is still what they saw.
    The nonce is used up whatever happens next. Reaching the quorum approves the plan; a rejection ends it.
    Given `plan` (the page's), a nonce begun on another plan is refused."""
    now = now or timezone.now()

    def still_stands(request: SigningRequest) -> tuple[Plan, dict[str, Any]]:
        plan = Plan.objects.select_related("run__agent", "requested_by").get(pk=request.plan_id)
        if plan.state != Plan.State.READY:
            raise signing.SigningRefused(
                f"The plan is {plan.get_state_display().lower()} now; nothing was signed."
            )
        refusal = signing_refusal(plan=plan, user=user)
        if refusal:
            raise signing.SigningRefused(refusal)
        content = plan_content(plan, choices=request.choices if request.decision == signing.APPROVE else None,
                               overrides=request.overrides)
        if planning.digest(content) != request.digest:
            raise signing.SigningRefused(
                "The plan changed while you were signing; read it again and sign the new version."
            )
        return plan, content

    request, (plan, content), passkey, new_count = _redeem(
        user=user,
        nonce=nonce,
        credential=credential,
        about="plan",
        still_stands=still_stands,
        now=now,
        subject=plan,
    )
    rules = ApprovalRules.of_plan(plan)
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.state != Plan.State.READY or locked.digest != plan.digest:
            raise signing.SigningRefused("The plan changed while you were signing; nothing was signed.")
        if request.decision == signing.APPROVE and signed_already(plan=locked, user=user, now=now):
            raise signing.SigningRefused("You approved this plan as it is now already (in another window?): "
                                         "nothing more was signed.")
        _keep_passkey_use(passkey, new_count, now)
        overridden = []
        if request.decision == signing.APPROVE:
            overridden = _keep_choices(plan, request, user=user, now=now)
            plan.digest = (
                request.digest
            )  # the choices are now part of the plan: earlier approvals of other choices lapse
        approval = Approval.objects.create(
            plan=plan, approver=user, passkey=passkey, decision=request.decision, reason=request.reason,
            digest=request.digest, choices=request.choices, overrides=request.overrides, content=content,
            nonce=request.nonce, challenge=request.challenge, assertion=credential, created_at=now,
            expires_at=signing.expiry(now=now, valid_for=rules.valid_for, deadlines=_deadlines(plan)),
        )
        traced.signed(plan, approval)
        journal_services.record_event(run_id=plan.run_id, event="approval", now=now, data={
            "plan": str(plan.public_id), "decision": approval.decision, "by": user.get_username(),
            "passkey": passkey.credential_id, "digest": approval.digest, "choices": approval.choices,
            **({"overrides": approval.overrides} if approval.overrides else {}),
            "nonce": approval.nonce, "reason": approval.reason or None,
        })
        for item in overridden:
            _journal_override(plan, item, by=user, digest=approval.digest, now=now)
        if approval.decision == Approval.Decision.APPROVE:  # from its first approval, it holds its records
            leases.take(plan=plan, now=now, until=approval.expires_at)
        plan.updated_at = now
        plan.save(update_fields=["digest", "updated_at"])
        if approval.decision == Approval.Decision.REJECT:
            reject(plan=plan)
        elif len(counted := counting_approvals(plan=plan, now=now, rules=rules)) >= rules.quorum:
            approve(plan=plan, approvers=[a.approver.get_username() for a in counted], now=now)
        if plan.state in (Plan.State.APPROVED, Plan.State.REJECTED):
            bell.ring(bell.NOTIFY_PLAN_DECIDED, plan.pk)
    return approval


def _keep_choices(plan: Plan, request: SigningRequest, *, user, now: datetime) -> list[PlanItem]:
    """The signed choices become the plan's. An overwrite asked for now, or with other words than before, is
    this approver's override (who and when are kept with it); returns those items."""
    overridden = []
    for item in plan.items.select_related("step__run").filter(
            position__in=[int(p) for p in request.choices]):
        choice = request.choices[str(item.position)]
        why = request.overrides.get(str(item.position), "") if choice == PlanItem.Choice.OVERWRITE else ""
        if (item.conflict_choice, item.override_reason) == (choice, why):
            continue
        item.conflict_choice, item.override_reason = choice, why
        item.override_by, item.override_at = (user, now) if why else (None, None)
        item.save(update_fields=["conflict_choice", "override_reason", "override_by", "override_at"])
        if why:
            overridden.append(item)
    return overridden


def _journal_override(plan: Plan, item: PlanItem, *, by, digest: str, now: datetime) -> None:
    """An override is its own event in the plan's run: who asked, why, the version the agent left and the
    newer one the undo will overwrite."""
    current = (item.check_detail or {}).get("current") or {}
    journal_services.record_event(run_id=plan.run_id, event="override", now=now, data={
        "plan": str(plan.public_id), "item": item.position, "step": item.step.number,
        **({"run": str(item.step.run.public_id)} if item.step.run_id != plan.run_id else {}),
        "by": by.get_username(), "reason": item.override_reason,
        "agentLeft": item.if_version or None, "overwrites": current.get("version") or None,
        "changedBy": current.get("changedBy") or None, "digest": digest,
    })
    webhooks.emit("plan.override", {
        "plan": str(plan.public_id), "team": plan.run.team.name, "item": item.position,
        "step": item.step.number, "by": by.get_username(), "reason": item.override_reason,
        "overwrites": current.get("version") or None, "changedBy": current.get("changedBy") or None},
        team_id=plan.run.team_id, now=now)


def _deadlines(plan: Plan) -> list[datetime]:
    return [d for d in plan.items.filter(action=PlanItem.Action.COMPENSATE).exclude(
        conflict_choice=PlanItem.Choice.KEEP_NEWER).values_list("undo_by", flat=True) if d is not None]


def approve(*, plan: Plan, approvers: list[str] | None, now: datetime) -> None:
    """The one way a plan becomes approved: by a quorum of signatures (`approvers`, their names), or by the
    autonomy policies when no human is needed (`approvers` None; the plan keeps the digest they let run).
    The caller holds the plan's row lock in a transaction; the worker is rung once it commits."""
    plan.state = Plan.State.APPROVED
    fields = ["state"]
    data: dict[str, Any] = {
        "plan": str(plan.public_id),
        "digest": plan.digest,
        "approvers": sorted(approvers or []),
    }
    if approvers is None:
        plan.approved_by_policy = plan.digest
        fields.append("approved_by_policy")
        data["byPolicy"] = True
    plan.save(update_fields=fields)
    leases.take(plan=plan, now=now)
    bell.ring(bell.EXECUTE_PLAN, plan.pk)
    journal_services.record_event(run_id=plan.run_id, event="plan_approved", now=now, data=data)


def reject(*, plan: Plan) -> None:
    """A plan rejected by an approver: it ends, and its steps are free for another plan."""
    plan.state = Plan.State.REJECTED
    plan.save(update_fields=["state"])
    plan.items.update(holds_step=False)
    leases.release(plan=plan, now=timezone.now(), why="the plan was rejected")


# -- held calls ----------------------------------------------------------------------------------------------


def begin_action_signing(*, action: ActionRequest, user, decision: str, reason: str = "",
                         now: datetime | None = None) -> tuple[SigningRequest, str]:
    """A one-time challenge for the approver's passkey over the held call's exact content."""
    now = now or timezone.now()
    refusal = action_refusal(action=action, user=user)
    if refusal:
        raise ActionRefused(refusal)
    if decision not in signing.DECISIONS:
        raise ActionRefused("Approve or deny.")
    if decision == signing.REJECT and not reason.strip():
        raise ActionRefused("Say why you deny it: the agent's owner reads it.")
    keys = _signing_keys(
        user, none_words="Enrol a passkey first: decisions on held calls are signed with it."
    )
    return _issue(user=user, keys=keys, decision=decision, reason=reason, now=now, action=action,
                  digest=action.digest, payload=lambda nonce: signing.action_payload(
                      action=str(action.public_id), digest=action.digest, decision=decision, nonce=nonce))


def complete_action_signing(*, user, nonce: str, credential: Any, action: ActionRequest | None = None,
                            now: datetime | None = None) -> ActionApproval:
    """Keep the approver's signed decision on a held call. Enough approvals approve it (the held call, or
    the agent's next identical call, then goes through once); one denial denies it. Given `action` (the
    page's), a nonce begun on another held call is refused."""
    subject = action
    now = now or timezone.now()

    def still_stands(request: SigningRequest) -> ActionRequest:
        action = ActionRequest.objects.select_related("agent", "server").get(pk=request.action_id)
        refusal = action_refusal(action=action, user=user)
        if refusal:
            raise ActionRefused(refusal)
        if action.expires_at <= now:
            raise ActionRefused("This held call has expired; the agent must ask again.")
        return action

    request, action, passkey, new_count = _redeem(
        user=user, nonce=nonce, credential=credential, about="action", still_stands=still_stands, now=now,
        subject=subject)
    with transaction.atomic():
        locked = ActionRequest.objects.select_for_update().get(pk=action.pk)
        if locked.state != ActionRequest.State.PENDING or locked.digest != request.digest:
            raise ActionRefused("This call was decided a moment ago; nothing was signed.")
        _keep_passkey_use(passkey, new_count, now)
        approval = ActionApproval.objects.create(
            request=locked, approver=user, passkey=passkey, decision=request.decision, reason=request.reason,
            digest=request.digest, nonce=request.nonce, challenge=request.challenge, assertion=credential,
            created_at=now)
        approvals = locked.approvals.filter(decision=ActionApproval.Decision.APPROVE)
        if approval.decision == ActionApproval.Decision.REJECT:
            locked.state, locked.decision_reason = ActionRequest.State.DENIED, approval.reason
        elif approvals.count() >= locked.quorum:
            locked.state = ActionRequest.State.APPROVED
        if locked.state != ActionRequest.State.PENDING:
            names = (
                approvals.values_list("approver__username", flat=True)
                if locked.state == ActionRequest.State.APPROVED
                else [user.get_username()]
            )
            locked.decided_at, locked.decided_by = now, ", ".join(sorted(names))
            locked.save(update_fields=["state", "decided_at", "decided_by", "decision_reason"])
        if locked.run_id:
            journal_services.record_event(run_id=locked.run_id, event="action_decision", now=now, data={
                "action": str(locked.public_id), "decision": approval.decision, "by": user.get_username(),
                "passkey": passkey.credential_id, "digest": approval.digest, "nonce": approval.nonce,
                "reason": approval.reason or None, "state": locked.state})
        if locked.state != ActionRequest.State.PENDING:  # plans drafted while it was held follow it
            following.after_commit(step_id=locked.step_id, now=now, why=(
                f"the call held at its step was {locked.get_state_display().lower()} by {locked.decided_by}"))
    return approval
