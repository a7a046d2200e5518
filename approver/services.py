"""Every write on the approval side: reversal plans, their items and their checks.

Rule of the house: no outside I/O inside a transaction. Checks talk to tool servers (`approver.checks`)
with no transaction open; each answer is written in its own short transaction as it arrives.
"""

import hashlib
import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

import anyio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url

from journal import declarations, sql
from journal import services as journal_services
from journal.mcp.client import Endpoint, ToolServerError, Upstreams, endpoint_of
from journal.models import Run, Step, StepDependency

from . import answers, checks, execution, passkeys, planning, policy, roles, signing
from .checks import CheckResult
from .models import (
    ActionApproval,
    ActionRequest,
    Approval,
    ApprovalRules,
    AutonomyPolicy,
    Passkey,
    Plan,
    PlanItem,
    PolicyChange,
    SigningRequest,
)

logger = logging.getLogger(__name__)

# The Step columns planning reads; a 10,000-step run is one query of these.
_FACT_FIELDS = (
    "id", "number", "server_name", "tool", "status", "reversibility", "declaration", "compensation_arguments",
    "undo_problems", "effect_summary", "effect_resource", "effect_version", "undo_by", "finished_at",
    "request_meta", "failure_class",
)


class PlanRefused(Exception):
    """The request cannot become a plan. `message` is for the person who asked; `open_plan` is set when a
    step is already in another open plan."""

    def __init__(self, message: str, *, open_plan: Plan | None = None):
        super().__init__(message)
        self.message = message
        self.open_plan = open_plan


def _facts(run: Run) -> list[planning.StepFacts]:
    inferred: dict[int, dict[int, tuple]] = {}
    for step_id, earlier, pointers in (
        StepDependency.objects.filter(step__run=run, rule=StepDependency.Rule.INFERRED)
        .values_list("step_id", "depends_on__number", "pointers")
    ):
        inferred.setdefault(step_id, {})[earlier] = tuple(pointers or ())
    undone = set(
        PlanItem.objects.filter(step__run=run, outcome="compensated").values_list("step_id", flat=True)
    )
    facts = []
    for row in Step.objects.filter(run=run).order_by("number").values(*_FACT_FIELDS):
        journal = (row["request_meta"] or {}).get(declarations.HATP_KEY)
        declared = journal.get("dependsOn") if isinstance(journal, dict) else None
        facts.append(planning.StepFacts(
            id=row["id"], number=row["number"], server=row["server_name"], tool=row["tool"], status=row["status"],
            reversibility=row["reversibility"], declaration=row["declaration"] or {},
            compensation_arguments=row["compensation_arguments"], undo_problems=tuple(row["undo_problems"] or ()),
            effect_summary=row["effect_summary"], effect_resource=row["effect_resource"],
            effect_version=row["effect_version"], undo_by=row["undo_by"], finished_at=row["finished_at"],
            declared_deps=tuple(n for n in declared if isinstance(n, int) and not isinstance(n, bool))
            if isinstance(declared, list) else None,
            inferred_deps=inferred.get(row["id"], {}), already_undone=row["id"] in undone,
            failure_class=row["failure_class"],
        ))
    return facts


def request_plan(*, run: Run, requested_by, reason: str = "", from_step: int | None = None,
                 steps: list[int] | None = None, now: datetime | None = None) -> Plan:
    """Build a reversal plan for `run`, from step N onwards or for a chosen set of steps, and queue its
    checks. Refused (PlanRefused) when the selection is empty or unknown, or when a step in it is already
    in an open plan."""
    now = now or timezone.now()
    if (from_step is None) == (not steps):
        raise PlanRefused("Say where to undo from (a step number), or which steps to undo.")
    facts = _facts(run)
    if from_step is not None:
        chosen = {s.number for s in facts if s.number >= from_step}
        if not chosen:
            raise PlanRefused(f"The run has no step {from_step}.")
    else:
        chosen = set(steps)
    try:
        pulled = planning.closure(facts, chosen)
    except planning.PlanningError as exc:
        raise PlanRefused(str(exc)) from None
    _refuse_if_held(facts, pulled)

    plan = Plan(run=run, requested_by=requested_by, reason=reason.strip(), from_step=from_step,
                chosen_steps=sorted(chosen) if from_step is None else [], created_at=now, updated_at=now,
                state=Plan.State.CHECKING, check_round=1)
    drafts = planning.draft_items(facts, pulled, plan_id=str(plan.public_id), now=now)
    items = [_item_row(plan, draft) for draft in drafts]
    plan.checks_total = sum(item.action == PlanItem.Action.COMPENSATE for item in items)
    plan.compensate_count = plan.checks_total
    plan.cannot_undo_count = sum(item.action == PlanItem.Action.CANNOT_UNDO for item in items)
    try:
        with transaction.atomic():
            plan.save()
            PlanItem.objects.bulk_create(items, batch_size=500)
            plan.digest = planning.digest(plan_content(plan))
            plan.save(update_fields=["digest"])
            journal_services.record_event(run_id=run.pk, event="plan", now=now, data={
                "plan": str(plan.public_id), "requestedBy": requested_by.get_username(), "reason": plan.reason,
                "selection": plan.selection_text, "items": len(items), "digest": plan.digest,
            })
            transaction.on_commit(lambda: _ring(plan))
    except IntegrityError:
        # Another request took one of these steps between our check and our insert.
        _refuse_if_held(facts, pulled)
        raise PlanRefused("Another plan for these steps was being made at the same moment; try again.") from None
    return plan


def _refuse_if_held(facts: list[planning.StepFacts], pulled: dict[int, planning.Pull]) -> None:
    ids = [s.id for s in facts if s.number in pulled]
    held = (
        PlanItem.objects.filter(step_id__in=ids, holds_step=True).select_related("plan", "step")
        .order_by("step__number").first()
    )
    if held is not None:
        raise PlanRefused(
            f"Step {held.step.number} is already in an open plan ({held.plan.get_state_display().lower()}); "
            "finish or cancel that plan first.", open_plan=held.plan)


def _item_row(plan: Plan, draft: planning.ItemDraft) -> PlanItem:
    return PlanItem(
        plan=plan, step_id=draft.step.id, position=draft.position, action=draft.action, rule=draft.pull.rule,
        pulled_in_by=draft.pull.by, pointers=list(draft.pull.pointers), tool=draft.tool, arguments=draft.arguments,
        if_version=draft.if_version, idempotency_key=draft.idempotency_key, dialect=draft.dialect, via=draft.via,
        side_effect=draft.side_effect, cost=draft.cost, undo_by=draft.undo_by, needs_human=draft.needs_human,
        reason=draft.reason, remedy=draft.remedy,
        check_status=PlanItem.Check.PENDING if draft.action == PlanItem.Action.COMPENSATE else PlanItem.Check.NOT_NEEDED,
    )


def _ring(plan: Plan) -> None:
    from .tasks import check_plan

    check_plan.delay(plan.pk, plan.check_round)


# -- the content an approver signs ------------------------------------------------------------------------


# What the content reads of each item and its step: plain values, one query, whatever the plan's size.
_CONTENT_FIELDS = (
    "position", "action", "rule", "pulled_in_by", "tool", "arguments", "if_version", "idempotency_key",
    "needs_human", "via", "side_effect", "cost", "undo_by", "reason", "remedy", "check_status", "check_detail",
    "conflict_choice",
    "step__number", "step__server_name", "step__tool", "step__effect_summary", "step__effect_resource",
    "step__effect_version",
)


def content_rows(plan: Plan) -> list[dict[str, Any]]:
    return list(plan.items.order_by("position").values(*_CONTENT_FIELDS))


def plan_content(plan: Plan, rows: list[dict[str, Any]] | None = None,
                 choices: dict[str, str] | None = None) -> dict[str, Any]:
    """The plan's content, exactly as it is digested (`rows` from `content_rows`, read if not given), or as
    it would be with these conflict `choices` (item position as text -> choice) in place of the stored ones."""
    items = []
    for row in content_rows(plan) if rows is None else rows:
        choice = row["conflict_choice"] if choices is None else choices.get(str(row["position"]), "")
        compensate = row["action"] == PlanItem.Action.COMPENSATE
        items.append(planning.item_content(
            position=row["position"], step=row["step__number"], server=row["step__server_name"],
            tool=row["step__tool"], action=row["action"], rule=row["rule"], pulled_in_by=row["pulled_in_by"],
            compensation={"tool": row["tool"], "arguments": row["arguments"], "ifVersion": row["if_version"] or None,
                          "idempotencyKey": row["idempotency_key"]} if compensate else None,
            needs_human=row["needs_human"], via=row["via"], side_effect=row["side_effect"], cost=row["cost"],
            undo_by=row["undo_by"].isoformat() if row["undo_by"] else None, reason=row["reason"],
            remedy=row["remedy"],
            effect={"summary": row["step__effect_summary"], "resource": row["step__effect_resource"],
                    "version": row["step__effect_version"]},
            check={"status": row["check_status"] or None, **(row["check_detail"] or {})} if compensate else None,
            conflict_choice=choice,
        ))
    return planning.plan_content(plan={
        "plan": str(plan.public_id), "run": str(plan.run.public_id), "requestedBy": plan.requested_by.get_username(),
        "reason": plan.reason, "selection": {"fromStep": plan.from_step} if plan.from_step is not None
        else {"steps": plan.chosen_steps},
    }, items=items)


def items_for_page(plan: Plan):
    """Every item with what the plan page shows of its step, in one query whatever the plan's size."""
    return plan.items.select_related("step", "call_step").order_by("position").only(
        *(f.name for f in PlanItem._meta.concrete_fields if f.name != "plan"), "plan_id",
        "step__number", "step__server_name", "step__tool", "step__effect_summary", "step__effect_resource",
        "step__effect_version", "step__finished_at", "step__run_id", "call_step__number")


# -- checks -------------------------------------------------------------------------------------------------


def queue_checks(*, plan: Plan, now: datetime | None = None, ring: bool = True) -> bool:
    """Start a new round of checks on a draft or ready plan: every compensate item goes back to `pending`
    and the worker is asked once the transaction commits (unless `ring` is False: the caller runs the
    round itself). False if the plan is in no state to be checked."""
    now = now or timezone.now()
    with transaction.atomic():
        claimed = Plan.objects.filter(pk=plan.pk, state__in=[Plan.State.DRAFT, Plan.State.READY]).update(
            state=Plan.State.CHECKING, checks_done=0, check_round=F("check_round") + 1, updated_at=now)
        if not claimed:
            return False
        # Conflict choices answered the old results; a new round must be chosen on afresh.
        plan.items.filter(action=PlanItem.Action.COMPENSATE).update(
            check_status=PlanItem.Check.PENDING, check_detail={}, checked_at=None, conflict_choice="")
        plan.refresh_from_db()
        if ring:
            transaction.on_commit(lambda: _ring(plan))
    return True


def record_checks(*, plan: Plan, check_round: int, results: list[tuple[int, CheckResult]],
                  now: datetime | None = None) -> None:
    """Keep check results as they arrive (a batch of whatever came in meanwhile, in one short
    transaction); the plan's progress counter moves with them. Only a `pending` item of the plan's current
    round takes a result."""
    now = now or timezone.now()
    with transaction.atomic():
        if not Plan.objects.select_for_update().filter(
                pk=plan.pk, state=Plan.State.CHECKING, check_round=check_round).exists():
            return
        # The hand-built conditional update of the Recorder's hot path: a batch of hundreds of answers is a
        # few milliseconds, not a long hold on the lock (and on the interpreter) while checks are in flight.
        done = sum(
            sql.update(PlanItem, item_id, {"check_status": result.status, "check_detail": result.detail,
                                           "checked_at": now}, only_if={"check_status": PlanItem.Check.PENDING})
            for item_id, result in results
        )
        if done:
            Plan.objects.filter(pk=plan.pk).update(checks_done=F("checks_done") + done, updated_at=now)


def run_checks(*, plan: Plan, check_round: int, now: datetime | None = None) -> Plan | None:
    """Check every item of this round still `pending` against its server, keeping results as they arrive,
    then mark the plan ready. Safe to run twice (a worker that died is simply asked again): answered items
    are not asked again. None when the plan has moved on from this round."""
    now = now or timezone.now()
    if not Plan.objects.filter(pk=plan.pk, state=Plan.State.CHECKING, check_round=check_round).exists():
        return None
    rows = plan.items.filter(action=PlanItem.Action.COMPENSATE, check_status=PlanItem.Check.PENDING).values(
        "id", "dialect", "tool", "arguments", "if_version", "idempotency_key", "undo_by", "step__server__name",
        "step__server__transport", "step__server__url", "step__server__command")
    targets, orphans = [], []
    endpoints: dict[tuple, Endpoint] = {}
    for row in rows:
        if row["step__server__name"] is None:
            orphans.append((row["id"], CheckResult("unavailable", {"message": "The tool server is no longer registered."})))
            continue
        where = (row["step__server__name"], row["step__server__transport"], row["step__server__url"],
                 row["step__server__command"])
        endpoint = endpoints.setdefault(where, Endpoint(*where))
        targets.append(checks.CheckTarget(
            item_id=row["id"], endpoint=endpoint, dialect=row["dialect"], tool=row["tool"],
            arguments=row["arguments"] or {}, if_version=row["if_version"], idempotency_key=row["idempotency_key"],
            undo_by=row["undo_by"]))
    if orphans:
        record_checks(plan=plan, check_round=check_round, results=orphans, now=now)
    anyio.run(_check_and_record, plan, check_round, targets, now)
    return finish_checks(plan=plan, check_round=check_round)


# Check results are written at most this often: the progress line moves several times a second, and a
# plan of hundreds of items costs a handful of transactions instead of one per item.
WRITE_EVERY = 0.25


async def _check_and_record(plan: Plan, check_round: int, targets: list, now: datetime) -> None:
    """Run the checks; a writer task keeps their results in batches, off the event loop, so a slow
    database never holds up the servers' answers."""
    send, receive = anyio.create_memory_object_stream(max_buffer_size=len(targets) + 1)
    write = sync_to_async(record_checks)

    async def writer():
        async with receive:
            async for first in receive:
                batch = [first]
                with anyio.move_on_after(WRITE_EVERY):
                    async for more in receive:
                        batch.append(more)
                await write(plan=plan, check_round=check_round, results=batch)

    async def on_result(item_id: int, result: CheckResult) -> None:
        await send.send((item_id, result))

    async with anyio.create_task_group() as group:
        group.start_soon(writer)
        async with send, Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
            await checks.check_all(targets, upstreams=upstreams, now=now, per_server=settings.PLAN_CHECKS_PER_SERVER,
                                   timeout=settings.TOOL_SERVER_TIMEOUT, on_result=on_result)


def finish_checks(*, plan: Plan, check_round: int, now: datetime | None = None) -> Plan:
    """Every item of the round has an answer: the plan is ready, with a digest over the new results."""
    now = now or timezone.now()
    with transaction.atomic():
        plan = Plan.objects.select_for_update().select_related("run", "requested_by").get(pk=plan.pk)
        if plan.state != Plan.State.CHECKING or plan.check_round != check_round:
            return plan
        rows = content_rows(plan)
        if any(row["check_status"] == PlanItem.Check.PENDING for row in rows):
            return plan  # a result was not kept (the writer failed); the stalled-check task asks again
        plan.digest = planning.digest(plan_content(plan, rows))
        plan.conflict_count = sum(row["check_status"] == PlanItem.Check.CONFLICT for row in rows)
        plan.state, plan.checked_at, plan.updated_at = Plan.State.READY, now, now
        plan.save(update_fields=["digest", "conflict_count", "state", "checked_at", "updated_at"])
        counts: dict[str, int] = {}
        for row in rows:
            if row["check_status"]:
                counts[row["check_status"]] = counts.get(row["check_status"], 0) + 1
        journal_services.record_event(run_id=plan.run_id, event="check", now=now, data={
            "plan": str(plan.public_id), "results": counts, "digest": plan.digest,
        })
        if not plan_needs_a_human(plan):
            # Everything in it can be taken back through the API, unchanged since, at no cost, and the
            # policies say such plans need no human: it runs at once, and says so in the record.
            plan.state, plan.approved_by_policy = Plan.State.APPROVED, plan.digest
            plan.save(update_fields=["state", "approved_by_policy"])
            journal_services.record_event(run_id=plan.run_id, event="plan_approved", now=now, data={
                "plan": str(plan.public_id), "digest": plan.digest, "approvers": [], "byPolicy": True})
            queue_execution(plan=plan)
            return plan
        transaction.on_commit(lambda: _tell("notify_plan_ready", plan.pk, plan.check_round))
    return plan


def _tell(task: str, *args) -> None:
    """Ring the worker. The row is already committed and is the record; a broker that is down must not turn
    that into an error for whoever caused it (an agent's held call, an approver's signature). The periodic
    tasks ring again for whatever is left waiting."""
    from . import tasks

    try:
        getattr(tasks, task).delay(*args)
    except Exception:
        logger.exception("could not ring the worker for %s%s; the periodic tasks will", task, args)


def cancel_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Close an open plan that has not been approved, freeing its steps for another plan."""
    now = now or timezone.now()
    with transaction.atomic():
        cancelled = Plan.objects.filter(
            pk=plan.pk, state__in=[Plan.State.DRAFT, Plan.State.CHECKING, Plan.State.READY]
        ).update(state=Plan.State.CANCELLED, updated_at=now)
        if not cancelled:
            return False
        plan.items.update(holds_step=False)
        journal_services.record_event(run_id=plan.run_id, event="plan_cancelled", now=now, data={
            "plan": str(plan.public_id), "by": by.get_username()})
    plan.refresh_from_db()
    return True


def plan_url(plan: Plan) -> str:
    return reverse("approver:plan_detail", args=[plan.public_id])


# -- passkeys -----------------------------------------------------------------------------------------------


def relying_party() -> passkeys.RelyingParty:
    return passkeys.RelyingParty(id=settings.WEBAUTHN_RP_ID, name=settings.WEBAUTHN_RP_NAME,
                                 origins=tuple(settings.WEBAUTHN_ORIGINS))


def user_handle(user) -> bytes:
    """The WebAuthn user id: stable per account and free of personal data, as the spec asks."""
    return hashlib.sha256(f"agent-undo-user:{user.pk}".encode()).digest()[:16]


def passkey_registration_options(*, user, challenge: bytes) -> str:
    existing = list(Passkey.objects.filter(user=user).values_list("credential_id", flat=True))
    return passkeys.registration_options(
        rp=relying_party(), user_handle=user_handle(user), user_name=user.get_username(),
        display_name=user.get_full_name() or user.get_username(), existing=existing, challenge=challenge)


def enroll_passkey(*, user, name: str, credential: Any, challenge: bytes, now: datetime | None = None) -> Passkey:
    """Keep a new passkey for `user` once its registration answers our challenge; PasskeyRefused if not."""
    name = (name or "").strip()[:100] or "Passkey"
    new = passkeys.verify_registration(rp=relying_party(), credential=credential, challenge=challenge)
    try:
        with transaction.atomic():
            return Passkey.objects.create(
                user=user, name=name, credential_id=new.credential_id, public_key=new.public_key,
                sign_count=new.sign_count, transports=new.transports, created_at=now or timezone.now())
    except IntegrityError:
        raise passkeys.PasskeyRefused("This passkey is already enrolled.") from None


def revoke_passkey(*, passkey: Passkey, now: datetime | None = None) -> bool:
    """A revoked passkey signs nothing more, and approvals it gave stop counting when a plan executes."""
    return bool(Passkey.objects.filter(pk=passkey.pk, revoked_at__isnull=True).update(revoked_at=now or timezone.now()))


# -- approvals ----------------------------------------------------------------------------------------------

SIGNING_SECONDS = 300  # how long a challenge waits for the approver's passkey


def signing_refusal(*, plan: Plan, user, rules: ApprovalRules | None = None) -> str:
    """Why `user` may not approve or reject `plan` (separation of duties, role), or "" if they may."""
    rules = rules or ApprovalRules.current()
    if not user.is_active or not roles.has_role(user, rules.approver_role):
        return f"Only members of {rules.approver_role} may approve or reject plans."
    if rules.separation_of_duties:
        if user.pk == plan.requested_by_id:
            return "You asked for this plan, so someone else must approve it (separation of duties)."
        agent = plan.run.agent
        if agent is not None and user.pk == agent.on_behalf_of_id:
            return "The agent acted for you, so someone else must approve undoing it (separation of duties)."
    return ""


def conflict_positions(plan: Plan) -> set[int]:
    return set(plan.items.filter(action=PlanItem.Action.COMPENSATE, check_status=PlanItem.Check.CONFLICT)
               .values_list("position", flat=True))


def begin_signing(*, plan: Plan, user, decision: str, choices: Any = None, reason: str = "",
                  now: datetime | None = None) -> tuple[SigningRequest, str]:
    """A one-time challenge for `user` to approve or reject `plan` as it is now, with their conflict
    choices, and the options for their browser. SigningRefused says why not."""
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
    reason = (reason or "").strip()
    if decision == "reject" and not reason:
        raise signing.SigningRefused("Say why you reject the plan: the requester reads it.")
    keys = list(Passkey.objects.active().filter(user=user).values_list("credential_id", flat=True))
    if not keys:
        raise signing.SigningRefused("Enrol a passkey first: approvals are signed with it.")
    choices = signing.clean_choices(choices, conflicts=conflict_positions(plan), decision=decision)
    digest = planning.digest(plan_content(plan, choices=choices if decision == "approve" else None))
    nonce = secrets.token_urlsafe(24)
    challenge = signing.challenge(signing.challenge_payload(
        plan=str(plan.public_id), digest=digest, decision=decision, choices=choices, nonce=nonce))
    request = SigningRequest.objects.create(
        plan=plan, user=user, nonce=nonce, decision=decision, choices=choices, reason=reason, digest=digest,
        challenge=bytes_to_base64url(challenge), created_at=now, expires_at=now + timedelta(seconds=SIGNING_SECONDS))
    options = passkeys.authentication_options(rp=relying_party(), challenge=challenge, credential_ids=keys)
    return request, options


def complete_signing(*, user, nonce: str, credential: Any, now: datetime | None = None) -> Approval:
    """Keep the approver's signed decision, once the assertion holds and the plan is still what they saw.
    The nonce is used up whatever happens next. Reaching the quorum approves the plan; a rejection ends it."""
    now = now or timezone.now()
    used = SigningRequest.objects.filter(nonce=str(nonce)[:64], user=user, plan__isnull=False, used_at__isnull=True,
                                         expires_at__gt=now).update(used_at=now)
    if not used:
        raise signing.SigningRefused("This signing request is unknown, already used or expired; start again.")
    request = SigningRequest.objects.select_related("plan").get(nonce=nonce)
    plan = Plan.objects.select_related("run__agent", "requested_by").get(pk=request.plan_id)
    if plan.state != Plan.State.READY:
        raise signing.SigningRefused(f"The plan is {plan.get_state_display().lower()} now; nothing was signed.")
    refusal = signing_refusal(plan=plan, user=user)
    if refusal:
        raise signing.SigningRefused(refusal)
    choices = request.choices if request.decision == "approve" else None
    content = plan_content(plan, choices=choices)
    if planning.digest(content) != request.digest:
        raise signing.SigningRefused("The plan changed while you were signing; read it again and sign the new version.")
    passkey = Passkey.objects.active().filter(user=user, credential_id=passkeys.credential_id_of(credential)).first()
    if passkey is None:
        raise signing.SigningRefused("That passkey is not one of your active passkeys.")
    try:
        new_count = passkeys.verify_assertion(rp=relying_party(), credential=credential,
                                              challenge=base64url_to_bytes(request.challenge),
                                              public_key=passkey.public_key, sign_count=passkey.sign_count)
    except passkeys.PasskeyRefused as refused:
        raise signing.SigningRefused(refused.message) from None
    rules = ApprovalRules.current()
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.state != Plan.State.READY or locked.digest != plan.digest:
            raise signing.SigningRefused("The plan changed while you were signing; nothing was signed.")
        Passkey.objects.filter(pk=passkey.pk).update(sign_count=new_count, last_used_at=now)
        if choices is not None:
            for position, choice in choices.items():
                plan.items.filter(position=int(position)).exclude(conflict_choice=choice).update(conflict_choice=choice)
            plan.digest = request.digest  # the choices are now part of the plan: earlier approvals of other choices lapse
        approval = Approval.objects.create(
            plan=plan, approver=user, passkey=passkey, decision=request.decision, reason=request.reason,
            digest=request.digest, choices=request.choices, content=content, nonce=request.nonce,
            challenge=request.challenge, assertion=credential, created_at=now,
            expires_at=signing.expiry(now=now, valid_for=rules.valid_for, deadlines=_deadlines(plan)),
        )
        journal_services.record_event(run_id=plan.run_id, event="approval", now=now, data={
            "plan": str(plan.public_id), "decision": approval.decision, "by": user.get_username(),
            "passkey": passkey.credential_id, "digest": approval.digest, "choices": approval.choices,
            "nonce": approval.nonce, "reason": approval.reason or None,
        })
        if approval.decision == Approval.Decision.REJECT:
            plan.state = Plan.State.REJECTED
            plan.items.update(holds_step=False)
        elif len(counted := counting_approvals(plan=plan, now=now, rules=rules)) >= rules.quorum:
            plan.state = Plan.State.APPROVED
            queue_execution(plan=plan)
            journal_services.record_event(run_id=plan.run_id, event="plan_approved", now=now, data={
                "plan": str(plan.public_id), "digest": plan.digest,
                "approvers": sorted(a.approver.get_username() for a in counted),
            })
        plan.updated_at = now
        plan.save(update_fields=["digest", "state", "updated_at"])
        if plan.state in (Plan.State.APPROVED, Plan.State.REJECTED):
            transaction.on_commit(lambda: _tell("notify_plan_decided", plan.pk))
    return approval


def _deadlines(plan: Plan) -> list[datetime]:
    return [d for d in plan.items.filter(action=PlanItem.Action.COMPENSATE).exclude(
        conflict_choice=PlanItem.Choice.KEEP_NEWER).values_list("undo_by", flat=True) if d is not None]


def counting_approvals(*, plan: Plan, now: datetime | None = None, rules: ApprovalRules | None = None) -> list[Approval]:
    """The approvals that count now, one per approver: of the plan's current content, not expired, by someone
    who still may approve (active, in the role, not barred by separation of duties) with a passkey that is
    not revoked. Execution asks again before it starts, so lost authority is never counted."""
    now = now or timezone.now()
    rules = rules or ApprovalRules.current()
    counted: dict[int, Approval] = {}
    for approval in (plan.approvals.filter(decision=Approval.Decision.APPROVE, digest=plan.digest, expires_at__gt=now,
                                           passkey__revoked_at__isnull=True)
                     .select_related("approver", "passkey").order_by("created_at")):
        if approval.approver_id in counted or signing_refusal(plan=plan, user=approval.approver, rules=rules):
            continue
        counted[approval.approver_id] = approval
    return list(counted.values())


def approvals_for_bundle(run: Run) -> list[dict[str, Any]]:
    """Every signed decision on the run's plans and held calls, with what an offline verifier needs: the
    fields the challenge was derived from, the assertion and the passkey's public key (SubjectPublicKeyInfo)."""
    def signed(approval, fields: dict[str, Any]) -> dict[str, Any]:
        response = approval.assertion.get("response", {}) if isinstance(approval.assertion, dict) else {}
        return {**fields, "approver": approval.approver.get_username(), "decision": approval.decision,
                "digest": approval.digest, "nonce": approval.nonce, "reason": approval.reason or None,
                "createdAt": approval.created_at.isoformat(), "credentialId": approval.passkey.credential_id,
                "publicKey": passkeys.spki(approval.passkey.public_key),
                "assertion": {key: response.get(key) for key in ("clientDataJSON", "authenticatorData", "signature")}}

    bundle = [signed(a, {"plan": str(a.plan.public_id), "choices": a.choices, "expiresAt": a.expires_at.isoformat()})
              for a in (Approval.objects.filter(plan__run=run).select_related("plan", "approver", "passkey")
                        .order_by("created_at", "pk"))]
    bundle += [signed(a, {"action": str(a.request.public_id)})
               for a in (ActionApproval.objects.filter(request__run=run).select_related("request", "approver", "passkey")
                         .order_by("created_at", "pk"))]
    return bundle


# -- execution ----------------------------------------------------------------------------------------------


class ExecutionStopped(Exception):
    """The plan no longer qualifies to run (its approvals lapsed); `message` says why."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def queue_execution(*, plan: Plan) -> None:
    """Ring the worker for an approved or executing plan (after the current transaction commits)."""
    transaction.on_commit(lambda: _tell("execute_plan", plan.pk))


def _qualifies(plan: Plan, now: datetime) -> None:
    if plan.approved_by_policy:
        # No human signed it: the policies let it run alone, and must still, for this exact content.
        refusal = "the plan changed since" if plan.approved_by_policy != plan.digest else plan_needs_a_human(plan)
        if refusal:
            raise ExecutionStopped(f"The policies no longer let this plan run without a human: {refusal}")
        return
    rules = ApprovalRules.current()
    counted = counting_approvals(plan=plan, now=now, rules=rules)
    if len(counted) < rules.quorum:
        raise ExecutionStopped(f"Only {len(counted)} of the {rules.quorum} approvals needed still hold "
                               "(expired, revoked, or the approver may no longer approve).")
    for approval in counted:  # the stored signature still covers the stored fields
        payload = signing.challenge_payload(plan=str(plan.public_id), digest=approval.digest,
                                            decision=approval.decision, choices=approval.choices, nonce=approval.nonce)
        try:
            passkeys.verify_assertion(rp=relying_party(), credential=approval.assertion,
                                      challenge=signing.challenge(payload), public_key=approval.passkey.public_key,
                                      sign_count=0)
        except passkeys.PasskeyRefused:
            raise ExecutionStopped(f"{approval.approver.get_username()}'s signature no longer verifies.") from None


def ring_later(plan: Plan, seconds: float) -> None:
    """Ring the executor for `plan` again in `seconds` (after the current transaction commits)."""
    from . import tasks

    transaction.on_commit(lambda: tasks.execute_plan.apply_async((plan.pk,), countdown=max(seconds, 0.0)))


def execute_plan(*, plan: Plan, later=None, now=timezone.now) -> Plan:
    """Run an approved plan's items in order, most recent first, each claimed with a conditional update and
    its outcome kept before the next starts. Safe to run twice and after a killed worker: a claimed item is
    never claimed again (`reconcile_execution` deals with one left running). Approvals are re-checked
    before every call; a plan that no longer qualifies stops, and what had not started is skipped.

    A failure that is safe to repeat lets the item go until its backoff is over and asks to be rung again
    then (`later(seconds)`, by default a Celery countdown), so no worker sleeps through a backoff and a
    pause or an abort takes effect before the next try."""
    later = later or (lambda seconds: ring_later(plan, seconds))
    if not Plan.objects.filter(pk=plan.pk, state__in=[Plan.State.APPROVED, Plan.State.EXECUTING]).update(
            state=Plan.State.EXECUTING, updated_at=now()):
        return Plan.objects.get(pk=plan.pk)
    plan = Plan.objects.select_related("run__agent", "requested_by").get(pk=plan.pk)
    facts = {f.number: f for f in _facts(plan.run)}
    numbers = sorted(facts)
    stops: dict[int, set[int]] = {}
    for done in plan.items.filter(exec_state="done", outcome__in=execution.STOPS_DEPENDENCIES).select_related("step"):
        stops[done.step.number] = _dependencies(facts, done.step.number, numbers)
    while True:
        item = plan.items.filter(exec_state="").select_related("step__server").order_by("position").first()
        if item is None:
            break
        state, stop_reason = Plan.objects.filter(pk=plan.pk).values_list("state", "stop_reason").get()
        if stop_reason:
            _stop(plan, stop_reason, now())
            break
        if state != Plan.State.EXECUTING:
            return Plan.objects.get(pk=plan.pk)  # paused: resuming rings again
        if item.retry_at is not None and item.retry_at > now():
            later((item.retry_at - now()).total_seconds())
            return Plan.objects.get(pk=plan.pk)
        try:
            _qualifies(plan, now())
        except ExecutionStopped as stopped:
            _stop(plan, stopped.message, now())
            break
        if not _claim(plan, item, now()):
            return Plan.objects.get(pk=plan.pk)  # another worker has an item of this plan in flight
        verdict = _run_item(plan, item, stops)
        if verdict.retry:
            _let_go(item, verdict, now())
            continue
        _keep_outcome(plan, item, verdict, now())
        if verdict.outcome in execution.STOPS_DEPENDENCIES:
            stops[item.step.number] = _dependencies(facts, item.step.number, numbers)
    return _finish(plan, now())


def _let_go(item: PlanItem, verdict: execution.Verdict, now: datetime) -> None:
    """After a failure that is safe to repeat: unclaim the item until its backoff is over, saying why."""
    attempt = item.attempts + 1
    retry_at = now + timedelta(seconds=execution.backoff(attempt))
    PlanItem.objects.filter(pk=item.pk, exec_state="running").update(
        exec_state="", retry_at=retry_at,
        outcome_detail={"retrying": {**verdict.detail, "attempt": attempt, "of": execution.MAX_ATTEMPTS,
                                     "at": retry_at.isoformat()}})


def _claim(plan: Plan, item: PlanItem, now: datetime) -> bool:
    """Claim `item` for this worker, under the plan's row lock, only while the plan is executing and no other
    item of it is in flight: one compensation at a time per plan keeps the reverse order even when two workers
    were rung for the same plan."""
    with transaction.atomic():
        locked = list(Plan.objects.select_for_update().filter(pk=plan.pk, state=Plan.State.EXECUTING, stop_reason="")
                      .values_list("pk", flat=True))
        if not locked or plan.items.filter(exec_state="running").exists():
            return False
        if not PlanItem.objects.filter(pk=item.pk, exec_state="").update(
                exec_state="running", attempts=F("attempts") + 1, exec_started_at=now):
            return False
        Plan.objects.filter(pk=plan.pk).update(updated_at=now)  # alive: the reconciler leaves it be
    return True


def _dependencies(facts: dict, number: int, numbers: list[int]) -> set[int]:
    step = facts[number]
    return execution.depends_on(number, earlier=numbers, declared=step.declared_deps,
                                inferred=set(step.inferred_deps))


def _run_item(plan: Plan, item: PlanItem, stops: dict[int, set[int]]) -> execution.Verdict:
    if item.action != PlanItem.Action.COMPENSATE:
        return execution.without_compensation(item.action, item.reason)
    if item.conflict_choice == PlanItem.Choice.KEEP_NEWER:
        return execution.Verdict(execution.SKIPPED, {"message": "The approver chose to keep the newer change."})
    blocker = execution.stopped_by(item.step.number, stops)
    if blocker is not None:
        return execution.Verdict(execution.SKIPPED, {"message": f"Step {blocker} was not undone and depends on "
                                                                f"this one, so this one stays too."})
    if item.step.server is None:
        return execution.Verdict(execution.COMPENSATION_FAILED, {"message": "The tool server is no longer registered."})
    return _attempt(plan, item, item.attempts + 1)  # this claim's attempt


def _compensation_run(plan: Plan) -> int:
    """The run that journals this plan's compensation calls, created once (under the plan's row lock)."""
    if plan.compensation_run_id:
        return plan.compensation_run_id
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.compensation_run_id is None:
            now = timezone.now()
            locked.compensation_run = Run.objects.create(
                agent=None, started_at=now, last_activity_at=now,
                agent_label=f"Undo of {plan.run.agent_name} (plan {str(plan.public_id)[:8]})")
            locked.save(update_fields=["compensation_run"])
    plan.compensation_run_id = locked.compensation_run_id
    return plan.compensation_run_id


def compensation_call(item: PlanItem) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The arguments and request `_meta` of an item's compensation: its ifVersion (the version the approver
    chose to overwrite, when they did) and its stable idempotency key, in the arguments for HATP and in
    `_meta["hatp/journal"]` for the other dialects."""
    if_version = item.if_version
    if item.conflict_choice == PlanItem.Choice.OVERWRITE and item.check_status == PlanItem.Check.CONFLICT:
        if_version = ((item.check_detail or {}).get("current") or {}).get("version") or if_version
    contract = {"ifVersion": if_version, "idempotencyKey": item.idempotency_key}
    if item.dialect == planning.HATP:
        return {**(item.arguments or {}), **contract}, None
    return dict(item.arguments or {}), {declarations.HATP_KEY: contract}


def _attempt(plan: Plan, item: PlanItem, attempt: int) -> execution.Verdict:
    """One compensation call, journaled as a step of the plan's compensation run like any agent's call:
    the intent before it leaves, what came back after."""
    arguments, meta = compensation_call(item)
    run_id = _compensation_run(plan)
    started = timezone.now()
    opened = journal_services.open_step_in_run(
        run_id=run_id, server=item.step.server, tool=item.tool, arguments=arguments, request_meta=meta, now=started,
        who={"executor": "undo", "plan": str(plan.public_id), "attempt": attempt,
             "undoes": {"run": str(plan.run.public_id), "step": item.step.number}})
    PlanItem.objects.filter(pk=item.pk).update(call_step_id=opened.step_id)
    verdict, outcome = anyio.run(_compensate, item, arguments, meta, attempt)
    journal_services.close_step(opened=opened, outcome=outcome, started=started, finished=timezone.now())
    return verdict


async def _compensate(item: PlanItem, arguments: dict[str, Any], meta: dict[str, Any] | None,
                      attempt: int) -> tuple[execution.Verdict, journal_services.Outcome]:
    """One compensation call through the one client: the verdict, and what to journal."""
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        try:
            result = await upstreams.call_tool(endpoint_of(item.step.server), item.tool, arguments, meta=meta)
        except ToolServerError as exc:
            verdict = execution.read_failure(
                failure_class=exc.failure_class, message=exc.message, transient=exc.transient,
                may_have_acted=exc.may_have_acted, repeat_is_safe=item.dialect == planning.HATP,
                attempt=attempt)
            return verdict, journal_services.Outcome(error_message=exc.message, failure_class=exc.failure_class,
                                                     may_have_acted=exc.may_have_acted)
    return execution.read_answer(result), journal_services.Outcome(result=result)


def _keep_outcome(plan: Plan, item: PlanItem, verdict: execution.Verdict, now: datetime) -> None:
    with transaction.atomic():
        PlanItem.objects.filter(pk=item.pk, exec_state="running").update(
            exec_state="done", outcome=verdict.outcome, outcome_detail=verdict.detail, exec_finished_at=now,
            retry_at=None)
        journal_services.record_event(run_id=plan.run_id, event="compensation", now=now, data={
            "plan": str(plan.public_id), "step": item.step.number, "tool": item.tool or None,
            "arguments": item.arguments if item.action == PlanItem.Action.COMPENSATE else None,
            "idempotencyKey": item.idempotency_key or None, "outcome": verdict.outcome, "detail": verdict.detail,
            "call": _call_reference(plan, item),
        })


def _call_reference(plan: Plan, item: PlanItem) -> dict[str, Any] | None:
    """Where the item's latest compensation call is journaled: a step of the plan's compensation run."""
    row = (PlanItem.objects.filter(pk=item.pk, call_step__isnull=False)
           .values_list("call_step__run__public_id", "call_step__number").first())
    return {"run": str(row[0]), "step": row[1]} if row else None


def _stop(plan: Plan, reason: str, now: datetime) -> None:
    """Nothing more starts. An item waiting to be tried again failed (or, if its last try may have acted,
    nobody knows); what never started is skipped."""
    with transaction.atomic():
        for item in plan.items.filter(exec_state="", attempts__gt=0):
            tried = (item.outcome_detail or {}).get("retrying") or {}
            outcome = execution.OUTCOME_UNKNOWN if tried.get("mayHaveActed") else execution.COMPENSATION_FAILED
            PlanItem.objects.filter(pk=item.pk, exec_state="").update(
                exec_state="done", outcome=outcome, exec_finished_at=now, retry_at=None,
                outcome_detail={**tried, "message": answers.bounded(
                    f"{tried.get('message') or 'It failed'}; stopped before trying again: {reason}")})
        PlanItem.objects.filter(plan=plan, exec_state="").update(
            exec_state="done", outcome=execution.SKIPPED, outcome_detail={"message": f"Not started: {reason}"},
            exec_finished_at=now)
        Plan.objects.filter(pk=plan.pk).update(stop_reason=reason)


def _outcome_state(plan: Plan, stop_reason: str) -> tuple[str, str]:
    """The finished plan's state and summary line, from its items' outcomes."""
    outcomes = list(plan.items.order_by("position").values_list("outcome", flat=True))
    undoable = [o for o in outcomes if o not in (execution.NO_COMPENSATION, execution.IRREVERSIBLE)]
    if not stop_reason and all(o == execution.COMPENSATED for o in undoable):
        state = Plan.State.COMPLETED
    else:
        state = Plan.State.PARTIALLY_COMPLETED if execution.COMPENSATED in undoable else Plan.State.FAILED
    return state, execution.summary_line(outcomes)


def _finish(plan: Plan, now: datetime) -> Plan:
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.state not in (Plan.State.EXECUTING, Plan.State.PAUSED) or plan.items.exclude(exec_state="done").exists():
            return locked  # another worker is still at it, or it is already finished
        state, summary = _outcome_state(plan, locked.stop_reason)
        locked.state, locked.execution_summary, locked.updated_at = state, summary, now
        locked.paused_by, locked.paused_at = "", None
        locked.save(update_fields=["state", "execution_summary", "updated_at", "paused_by", "paused_at"])
        plan.items.update(holds_step=False)
        journal_services.record_event(run_id=plan.run_id, event="plan_executed", now=now, data={
            "plan": str(plan.public_id), "state": state, "summary": locked.execution_summary,
            "stopReason": locked.stop_reason or None})
        transaction.on_commit(lambda: _tell("notify_plan_executed", plan.pk))
    return locked


def reconcile_execution(*, older_than: datetime, now: datetime | None = None) -> list[int]:
    """Pick up what a killed worker left: an item still `running` since before `older_than` is claimed
    again when repeating it is safe (an HATP server honours the idempotency key, so a repeat returns the
    first outcome), and otherwise becomes `outcome_unknown` for a human. Returns the plans to ring again."""
    now = now or timezone.now()
    stuck = PlanItem.objects.filter(exec_state="running", exec_started_at__lt=older_than,
                                    plan__state__in=[Plan.State.EXECUTING, Plan.State.PAUSED]
                                    ).select_related("plan__run", "step")
    for item in stuck:
        if item.dialect == planning.HATP:
            PlanItem.objects.filter(pk=item.pk, exec_state="running").update(exec_state="")
        else:
            _keep_outcome(item.plan, item, execution.Verdict(execution.OUTCOME_UNKNOWN, {
                "message": "The worker stopped during this compensation and the server may have acted; "
                           "check it before trying again."}), now)
    # An approved plan whose bell was lost (a broker restarted before the worker took it) is rung too.
    return list(Plan.objects.filter(state__in=[Plan.State.APPROVED, Plan.State.EXECUTING], updated_at__lt=older_than)
                .values_list("pk", flat=True))


def abort_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Stop an approved, executing or paused plan. The executor checks before every item, so the one in
    flight finishes and nothing after it starts; a plan no worker is running is finished here."""
    now = now or timezone.now()
    reason = f"Aborted by {by.get_username()}."
    if not Plan.objects.filter(pk=plan.pk, state__in=[Plan.State.APPROVED, Plan.State.EXECUTING, Plan.State.PAUSED],
                               stop_reason="").update(stop_reason=reason, updated_at=now):
        return False
    journal_services.record_event(run_id=plan.run_id, event="plan_aborted", now=now, data={
        "plan": str(plan.public_id), "by": by.get_username()})
    if Plan.objects.filter(pk=plan.pk, state__in=[Plan.State.APPROVED, Plan.State.PAUSED]).update(
            state=Plan.State.EXECUTING):
        _stop(plan, reason, now)
        _finish(plan, now)  # leaves it to the executor if an item is still in flight
    return True


def pause_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Hold an approved or executing plan: the item in flight finishes, nothing after it starts until someone
    resumes (or aborts) it. Approvals are re-checked when it resumes, as before every item."""
    now = now or timezone.now()
    if not Plan.objects.filter(pk=plan.pk, state__in=[Plan.State.APPROVED, Plan.State.EXECUTING],
                               stop_reason="").update(state=Plan.State.PAUSED, paused_by=by.get_username(),
                                                      paused_at=now, updated_at=now):
        return False
    journal_services.record_event(run_id=plan.run_id, event="plan_paused", now=now, data={
        "plan": str(plan.public_id), "by": by.get_username()})
    return True


def resume_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Let a paused plan go on from the next item not started."""
    now = now or timezone.now()
    with transaction.atomic():
        if not Plan.objects.filter(pk=plan.pk, state=Plan.State.PAUSED, stop_reason="").update(
                state=Plan.State.EXECUTING, paused_by="", paused_at=None, updated_at=now):
            return False
        journal_services.record_event(run_id=plan.run_id, event="plan_resumed", now=now, data={
            "plan": str(plan.public_id), "by": by.get_username()})
        queue_execution(plan=plan)
    return True


# -- outcomes a human must settle -----------------------------------------------------------------------------


class NotSettled(Exception):
    """A request about an unknown outcome that cannot be taken now; `message` says why."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


FINISHED_STATES = (Plan.State.COMPLETED, Plan.State.PARTIALLY_COMPLETED, Plan.State.FAILED)


def _unknown_item(plan: Plan, position: int) -> PlanItem:
    item = plan.items.filter(position=position).select_related("step__server").first()
    if item is None or item.outcome != execution.OUTCOME_UNKNOWN or item.exec_state != "done":
        raise NotSettled("That item's outcome is not unknown (any more); reload the report.")
    return item


def check_unknown(*, plan: Plan, position: int, by, now: datetime | None = None) -> dict[str, Any]:
    """Ask the tool server, without changing anything, where a compensation whose outcome is unknown stands.
    HATP servers answer `hatp_check` (would the undo work now, or has the record moved on); the other
    dialects have no such call, so the answer says what to look at. The answer is kept with the item and
    on the run's chain; the outcome stays unknown until a human settles it."""
    now = now or timezone.now()
    item = _unknown_item(plan, position)
    if item.step.server is None:
        raise NotSettled("The tool server is no longer registered.")
    if item.dialect == planning.HATP:
        arguments, _ = compensation_call(item)
        target = checks.CheckTarget(
            item_id=item.pk, endpoint=endpoint_of(item.step.server), dialect=item.dialect, tool=item.tool,
            arguments=item.arguments or {}, if_version=arguments["ifVersion"],
            idempotency_key=item.idempotency_key, undo_by=None)
        result = anyio.run(_check_one_now, target)
        words = {
            "ok": "The server says the undo has not happened and would work now: "
                  f"{result.detail.get('wouldDo') or ''}".rstrip(": "),
            "conflict": f"The record has moved on: {result.detail.get('message', '')}",
        }.get(result.status, result.detail.get("message") or "The server gave no answer.")
        answer = {"status": result.status, "message": answers.bounded(words)}
    else:
        answer = {"status": "no_check", "message": (
            f"{item.step.server_name} has no way to say whether {item.tool} took effect. Look at "
            f"{item.step.effect_resource or 'the record'} there, then settle it below.")}
    answer.update(by=by.get_username(), at=now.isoformat())
    with transaction.atomic():
        detail = {**(item.outcome_detail or {}), "checked": answer}
        if not PlanItem.objects.filter(pk=item.pk, outcome=execution.OUTCOME_UNKNOWN).update(outcome_detail=detail):
            raise NotSettled("That item's outcome was settled a moment ago; reload the report.")
        journal_services.record_event(run_id=plan.run_id, event="outcome_checked", now=now, data={
            "plan": str(plan.public_id), "step": item.step.number, **answer})
    return answer


async def _check_one_now(target: checks.CheckTarget) -> CheckResult:
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        return await checks.check_one(target, upstreams=upstreams, timeout=settings.TOOL_SERVER_TIMEOUT)


SETTLEMENTS = {
    "took_effect": (execution.COMPENSATED, "{who} confirmed by hand that it took effect."),
    "did_not": (execution.COMPENSATION_FAILED, "{who} confirmed by hand that it did not take effect."),
}


def settle_unknown(*, plan: Plan, position: int, by, settlement: str, now: datetime | None = None) -> Plan:
    """A human's word on an unknown outcome: it took effect, or it did not. The plan's summary is counted
    again; the human's name stays with the outcome and on the run's chain."""
    now = now or timezone.now()
    if settlement not in SETTLEMENTS:
        raise NotSettled("Say whether the compensation took effect or not.")
    item = _unknown_item(plan, position)
    outcome, words = SETTLEMENTS[settlement]
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.state not in FINISHED_STATES:
            raise NotSettled(f"The plan is {locked.get_state_display().lower()}; settle it once it has finished.")
        detail = {**(item.outcome_detail or {}), "message": words.format(who=by.get_username()),
                  "settledBy": by.get_username(), "settledAt": now.isoformat()}
        if not PlanItem.objects.filter(pk=item.pk, outcome=execution.OUTCOME_UNKNOWN).update(
                outcome=outcome, outcome_detail=detail):
            raise NotSettled("That item's outcome was settled a moment ago; reload the report.")
        locked.state, locked.execution_summary = _outcome_state(plan, locked.stop_reason)
        locked.updated_at = now
        locked.save(update_fields=["state", "execution_summary", "updated_at"])
        journal_services.record_event(run_id=plan.run_id, event="outcome_settled", now=now, data={
            "plan": str(plan.public_id), "step": item.step.number, "outcome": outcome, "by": by.get_username()})
    return locked


def retry_unknown(*, plan: Plan, position: int, by, now: datetime | None = None) -> None:
    """Run a compensation whose outcome is unknown again, with the same idempotency key (a server that honours
    it returns the first outcome instead of acting twice). A human asks for this after looking; the plan
    runs again for this one item, with its approvals re-checked first."""
    now = now or timezone.now()
    item = _unknown_item(plan, position)
    try:
        _qualifies(plan, now)
    except ExecutionStopped as stopped:
        raise NotSettled(f"The approvals no longer hold ({stopped.message}); request a new plan.") from None
    try:
        with transaction.atomic():
            locked = Plan.objects.select_for_update().get(pk=plan.pk)
            if locked.state not in FINISHED_STATES or locked.stop_reason:
                raise NotSettled(f"The plan is {locked.get_state_display().lower()}"
                                 f"{' and was stopped' if locked.stop_reason else ''}; it cannot run this again.")
            if not PlanItem.objects.filter(pk=item.pk, outcome=execution.OUTCOME_UNKNOWN).update(
                    exec_state="", outcome="", holds_step=True,
                    outcome_detail={"previous": item.outcome_detail, "retriedBy": by.get_username()}):
                raise NotSettled("That item's outcome was settled a moment ago; reload the report.")
            locked.state, locked.execution_summary, locked.updated_at = Plan.State.EXECUTING, "", now
            locked.save(update_fields=["state", "execution_summary", "updated_at"])
            journal_services.record_event(run_id=plan.run_id, event="compensation_retried", now=now, data={
                "plan": str(plan.public_id), "step": item.step.number, "by": by.get_username(),
                "idempotencyKey": item.idempotency_key})
            queue_execution(plan=plan)
    except IntegrityError:
        raise NotSettled(f"Step {item.step.number} is in another open plan now; finish that one first.") from None


# -- autonomy policies ---------------------------------------------------------------------------------------

POLICY_LOG = "autonomy-policies"  # the name the change log's signed heads carry in place of a run id


class PolicyRefused(Exception):
    """A policy edit that cannot be saved; `problems` maps field names to what is wrong."""

    def __init__(self, problems: dict[str, str]):
        super().__init__("; ".join(problems.values()))
        self.problems = problems


def policy_record(policy_row: AutonomyPolicy) -> dict[str, Any]:
    """A policy as the change log keeps it (and the simulator and the page show it)."""
    return {
        "id": policy_row.pk, "name": policy_row.name, "scope": policy_row.scope,
        "agent": policy_row.agent.name if policy_row.agent_id else None,
        "server": policy_row.server.name if policy_row.server_id else None, "tool": policy_row.tool or None,
        "decisions": dict(policy_row.decisions), "approverGroup": policy_row.approver_group,
        "quorum": policy_row.quorum, "askTimeout": policy_row.ask_timeout, "autoRunPlans": policy_row.auto_run_plans,
    }


def as_policy(policy_row: AutonomyPolicy) -> policy.Policy:
    return policy.Policy(id=policy_row.pk or 0, name=policy_row.name, scope=policy_row.scope,
                         decisions=dict(policy_row.decisions or {}),
                         agent=policy_row.agent.name if policy_row.agent_id else "",
                         server=policy_row.server.name if policy_row.server_id else "", tool=policy_row.tool,
                         auto_run_plans=policy_row.auto_run_plans)


def plan_needs_a_human(plan: Plan) -> str:
    """Why this checked plan needs approvers (see `policy.plan_needs_a_human`), or "" if it may run alone."""
    if not plan.run.agent_id:
        return "The run has no agent whose policy could let it run alone."
    items = [{"number": row["step__number"], "server": row["step__server_name"], "tool": row["step__tool"], **row}
             for row in plan.items.order_by("position").values(
                 "action", "via", "dialect", "check_status", "side_effect", "cost", "needs_human",
                 "step__number", "step__server_name", "step__tool")]
    return policy.plan_needs_a_human([as_policy(row) for row in current_policies()], agent=plan.run.agent.name,
                                     items=items)


def current_policies() -> list[AutonomyPolicy]:
    return list(AutonomyPolicy.objects.select_related("agent", "server"))


def clean_policy(row: AutonomyPolicy) -> None:
    """Check a draft before it is saved or simulated; PolicyRefused names every problem."""
    problems: dict[str, str] = {}
    decisions, wrong = policy.clean_decisions(row.decisions or {})
    problems.update({f"decision_{klass}": text for klass, text in wrong.items()})
    row.decisions = decisions
    if not (row.name or "").strip():
        problems["name"] = "Give the policy a name."
    if row.scope not in AutonomyPolicy.Scope.values:
        problems["scope"] = "Choose what the policy covers."
    if row.scope == AutonomyPolicy.Scope.AGENT and not row.agent_id:
        problems["agent"] = "Choose the agent this policy is for."
    if row.scope in (AutonomyPolicy.Scope.SERVER, AutonomyPolicy.Scope.TOOL) and not row.server_id:
        problems["server"] = "Choose the tool server this policy is for."
    if row.scope == AutonomyPolicy.Scope.TOOL and not (row.tool or "").strip():
        problems["tool"] = "Name the tool this policy is for."
    if row.scope == AutonomyPolicy.Scope.TOOL and row.server_id and row.tool and row.tool not in row.server.tool_names:
        problems["tool"] = f"{row.server.name} offers no tool named {row.tool!r}."
    if not row.quorum or row.quorum < 1:
        problems["quorum"] = "At least one approver must sign a held call."
    if not 1 <= (row.ask_timeout or 0) <= 3600:
        problems["ask_timeout"] = "A held call can wait between 1 second and 1 hour."
    if row.approver_group not in roles.ALL:
        problems["approver_group"] = f"Choose one of the groups: {', '.join(roles.ALL)}."
    if row.scope != AutonomyPolicy.Scope.AGENT:
        row.agent = None
    if row.scope not in (AutonomyPolicy.Scope.SERVER, AutonomyPolicy.Scope.TOOL):
        row.server = None
    if row.scope != AutonomyPolicy.Scope.TOOL:
        row.tool = ""
    clash = AutonomyPolicy.objects.exclude(pk=row.pk).filter(scope=row.scope)
    clash = {"agent": clash.filter(agent_id=row.agent_id), "server": clash.filter(server_id=row.server_id),
             "tool": clash.filter(server_id=row.server_id, tool=row.tool)}.get(row.scope, clash).first()
    if clash is not None and not problems:
        problems["scope"] = f"“{clash.name}” already covers {as_policy(clash).where}; edit that one instead."
    if problems:
        raise PolicyRefused(problems)


def save_policy(*, row: AutonomyPolicy, by, now: datetime | None = None) -> AutonomyPolicy:
    """Create or change a policy and log the change (who, when, before, after). Takes effect at the next call:
    the Recorder reads the policies for every call."""
    now = now or timezone.now()
    clean_policy(row)
    with transaction.atomic():
        before = None
        if row.pk:
            before = policy_record(AutonomyPolicy.objects.select_for_update().select_related("agent", "server")
                                   .get(pk=row.pk))
        row.updated_at = now
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError:
            raise PolicyRefused({"scope": "Another policy already covers this; edit that one instead."}) from None
        _log_policy_change("policy_changed" if before else "policy_created", by=by, now=now, before=before,
                           after=policy_record(row))
    return row


def delete_policy(*, row: AutonomyPolicy, by, now: datetime | None = None) -> None:
    now = now or timezone.now()
    with transaction.atomic():
        before = policy_record(row)
        row.delete()
        _log_policy_change("policy_deleted", by=by, now=now, before=before, after=None)


def _log_policy_change(event: str, *, by, now: datetime, before, after) -> PolicyChange:
    """Append to the change log, hash-chained and with its new head signed. The last entry is locked while
    appending; the unique `seq` is the backstop if two admins save at the same instant."""
    from journal import chain, keys

    last = PolicyChange.objects.select_for_update().order_by("-seq").first()
    entry = chain.make_entry(seq=(last.seq if last else 0) + 1, ts=chain.format_ts(now), event=event,
                             data={"by": by.get_username(), "before": before, "after": after},
                             prev_hash=last.hash if last else chain.GENESIS)
    key_id, private = keys.signing_key()
    signature = chain.sign(private, chain.checkpoint_payload(run=POLICY_LOG, seq=entry["seq"], head_hash=entry["hash"]))
    return PolicyChange.objects.create(seq=entry["seq"], ts=entry["ts"], event=event, data=entry["data"],
                                       prev_hash=entry["prevHash"], hash=entry["hash"], key_id=key_id,
                                       signature=signature)


def verify_policy_log():
    """Check the change log's chain and every signed head; name the first change that does not fit."""
    from journal import chain, keys

    rows = list(PolicyChange.objects.order_by("id"))
    entries = [{"seq": r.seq, "ts": r.ts, "event": r.event, "data": r.data, "prevHash": r.prev_hash, "hash": r.hash}
               for r in rows]
    checkpoints = [{"run": POLICY_LOG, "seq": r.seq, "headHash": r.hash, "keyId": r.key_id, "signature": r.signature}
                   for r in rows]
    return chain.verify(run=POLICY_LOG, entries=entries, checkpoints=checkpoints, public_keys=keys.public_keys())


# The policies as the Recorder last read them, keyed by the change log's head: every change appends to the
# log, so one indexed read per call tells whether they moved (in any process), and only then are they read
# again. Reading them through the ORM on every call cost the Recorder about 3 ms a call under load.
_policy_book: dict[str, Any] = {"head": None, "policies": [], "holds": {}}


def _policies_now() -> tuple[list[policy.Policy], dict[int, dict[str, Any]]]:
    head = sql.first_row(PolicyChange, ("seq", "hash"), "1 = 1 ORDER BY seq DESC LIMIT 1", [])
    book = _policy_book
    if book["head"] != head:
        rows = current_policies()
        book.update(head=head, policies=[as_policy(row) for row in rows], holds={
            row.pk: {"approverGroup": row.approver_group, "quorum": row.quorum, "askTimeout": row.ask_timeout}
            for row in rows})
    return book["policies"], book["holds"]


def decide_call(*, agent_name: str, server_name: str, tool: str, declaration) -> dict[str, Any]:
    """What the autonomy policies decide for an agent's call, as the run record keeps it. A change to the
    policies applies to the very next call (see `_policies_now`). `declaration` is the tool's own
    (journal.declarations.UndoDeclaration). An `ask` also carries how the call is held: who approves, how
    many, and how long the agent waits."""
    policies, holds = _policies_now()
    compensation = declaration.compensation
    decided = policy.decide(
        policies, agent=agent_name, server=server_name, tool=tool,
        kind=declaration.kind, via=declaration.via, dialect=compensation.dialect if compensation else None,
        reason=declaration.reason, remedy=declaration.remedy, source=declaration.source)
    record = decided.as_record()
    if decided.decision == "ask":
        default = {"approverGroup": roles.APPROVER, "quorum": 1, "askTimeout": 60}
        record["hold"] = {**holds.get(decided.policy.id if decided.policy else 0, default), "why": decided.why}
    return record


def recent_calls(last: int) -> list[dict[str, Any]]:
    """The agents' last `last` journaled calls, as `policy.decide` reads them (the tool's own declaration
    as it was when the call was made)."""
    rows = (Step.objects.filter(run__agent__isnull=False).order_by("-id")
            .values_list("run__agent__name", "server_name", "tool", "declaration")[:last])
    calls = []
    for agent_name, server_name, tool, declared in rows:
        declared = declared if isinstance(declared, dict) else {}
        compensation = declared.get("compensation") if isinstance(declared.get("compensation"), dict) else {}
        calls.append({"agent": agent_name, "server": server_name, "tool": tool,
                      "kind": declared.get("kind") or "unknown", "via": declared.get("via"),
                      "dialect": compensation.get("dialect"), "reason": declared.get("reason"),
                      "remedy": declared.get("remedy"), "source": declared.get("source") or "none"})
    return calls


def simulate_policy(*, draft: AutonomyPolicy, last: int = 200) -> dict[str, Any]:
    """What the policies would have decided for the last `last` calls with `draft` saved: counts and
    examples per decision, and how many calls would be decided differently from today."""
    today = [as_policy(row) for row in current_policies()]
    drafted = [p for p in today if not draft.pk or p.id != draft.pk] + [as_policy(draft)]
    calls = recent_calls(last)
    changes = []
    for call in calls:
        before, after = policy.decide(today, **call), policy.decide(drafted, **call)
        if before.decision != after.decision:
            changes.append({"tool": f"{call['server']}__{call['tool']}", "agent": call["agent"],
                            "before": before.decision, "after": after.decision})
    return {"calls": len(calls), "tally": policy.simulate(drafted, calls), "changed": len(changes),
            "changes": changes[:5]}


# -- held calls -----------------------------------------------------------------------------------------------


# A decision on a held call that cannot be taken is refused like a plan's signature: `message` says why.
ActionRefused = signing.SigningRefused


def action_digest(*, agent: str, server: str, tool: str, arguments: Any) -> str:
    """What an approval of a held call binds: the agent, the server, the tool and the exact arguments."""
    from journal.canonical import canonical_bytes

    return hashlib.sha256(canonical_bytes({"agent": agent, "server": server, "tool": tool,
                                           "arguments": arguments})).hexdigest()


def action_url(action: ActionRequest) -> str:
    return settings.PUBLIC_URL.rstrip("/") + reverse("approver:action_detail", args=[action.public_id])


def request_for_held_call(*, agent, server, tool: str, arguments: dict[str, Any], decision: dict[str, Any],
                          run_id: int, step_id: int, now: datetime | None = None) -> ActionRequest:
    """The action request a held call waits on: the open one for the same exact call (so an agent that asks
    again does not pile up requests), or a new one, which approvers are told of."""
    now = now or timezone.now()
    digest = action_digest(agent=agent.name, server=server.name, tool=tool, arguments=arguments)
    with transaction.atomic():
        existing = (ActionRequest.objects.select_for_update()
                    .filter(digest=digest, state__in=[ActionRequest.State.PENDING, ActionRequest.State.APPROVED],
                            expires_at__gt=now).order_by("created_at").first())
        if existing is not None:
            return existing
        hold = decision.get("hold") or {}
        chosen = decision.get("policy") or {}
        action = ActionRequest.objects.create(
            agent=agent, run_id=run_id, step_id=step_id, server=server, tool=tool, arguments=arguments,
            digest=digest, call_class=decision.get("class", "unknown"), reason=decision.get("reason", ""),
            why=hold.get("why") or {}, policy_id=chosen.get("id") or None, policy_name=chosen.get("name") or "",
            approver_group=hold.get("approverGroup") or roles.APPROVER, quorum=hold.get("quorum") or 1,
            created_at=now, expires_at=now + ApprovalRules.current().valid_for)
        journal_services.record_event(run_id=run_id, event="action_requested", now=now, data={
            "action": str(action.public_id), "digest": digest, "tool": tool, "server": server.name,
            "reason": action.reason})
        transaction.on_commit(lambda: _tell("notify_action_requested", action.pk))
    return action


def held_call_state(action_id: int) -> tuple[str, str, str, datetime] | None:
    """Where a held call's request stands (state, decided by, the decision's reason, expiry): what a waiting
    Recorder polls, one indexed read."""
    return ActionRequest.objects.filter(pk=action_id).values_list(
        "state", "decided_by", "decision_reason", "expires_at").first()


def claim_approved_action(*, action_id: int, step_id: int, now: datetime | None = None) -> bool:
    """Let one call through on an approval: approved becomes used, once (a conditional update)."""
    now = now or timezone.now()
    return bool(ActionRequest.objects.filter(pk=action_id, state=ActionRequest.State.APPROVED, expires_at__gt=now)
                .update(state=ActionRequest.State.USED, used_at=now, used_step_id=step_id))


def expire_held_calls(*, now: datetime | None = None) -> int:
    """Close held-call requests past their time: undecided, or approved but never used. The agent must ask
    again, and approvers see them as expired."""
    now = now or timezone.now()
    expired = 0
    for action in ActionRequest.objects.filter(
            state__in=[ActionRequest.State.PENDING, ActionRequest.State.APPROVED], expires_at__lte=now):
        with transaction.atomic():
            if ActionRequest.objects.filter(pk=action.pk, state=action.state).update(
                    state=ActionRequest.State.EXPIRED, decided_at=action.decided_at or now):
                expired += 1
                if action.run_id:
                    journal_services.record_event(run_id=action.run_id, event="action_expired", now=now, data={
                        "action": str(action.public_id), "was": action.state})
    return expired


def action_refusal(*, action: ActionRequest, user) -> str:
    """Why `user` may not decide on this held call now, or "" if they may."""
    if action.state != ActionRequest.State.PENDING:
        return f"This call is {action.get_state_display().lower()}; there is nothing to decide."
    if not roles.has_role(user, action.approver_group):
        return f"Only members of {action.approver_group} decide on held calls."
    if ApprovalRules.current().separation_of_duties and action.agent.on_behalf_of_id == user.pk:
        return "The agent acts for you, so someone else must decide on its calls."
    if action.approvals.filter(approver=user).exists():
        return "You have already decided on this call."
    return ""


def begin_action_signing(*, action: ActionRequest, user, decision: str, reason: str = "",
                         now: datetime | None = None) -> tuple[SigningRequest, str]:
    """A one-time challenge for the approver's passkey over the held call's exact content."""
    now = now or timezone.now()
    refusal = action_refusal(action=action, user=user)
    if refusal:
        raise ActionRefused(refusal)
    if decision not in signing.DECISIONS:
        raise ActionRefused("Approve or deny.")
    if decision == "reject" and not reason.strip():
        raise ActionRefused("Say why you deny it: the agent's owner reads it.")
    keys = list(Passkey.objects.active().filter(user=user).values_list("credential_id", flat=True))
    if not keys:
        raise ActionRefused("Enrol a passkey first: decisions on held calls are signed with it.")
    nonce = secrets.token_urlsafe(24)
    challenge = signing.challenge(signing.action_payload(action=str(action.public_id), digest=action.digest,
                                                         decision=decision, nonce=nonce))
    request = SigningRequest.objects.create(
        action=action, user=user, nonce=nonce, decision=decision, reason=reason, digest=action.digest,
        challenge=bytes_to_base64url(challenge), created_at=now, expires_at=now + timedelta(seconds=SIGNING_SECONDS))
    return request, passkeys.authentication_options(rp=relying_party(), challenge=challenge, credential_ids=keys)


def complete_action_signing(*, user, nonce: str, credential: Any, now: datetime | None = None) -> ActionApproval:
    """Keep the approver's signed decision on a held call. Enough approvals approve it (the held call, or
    the agent's next identical call, then goes through once); one denial denies it."""
    now = now or timezone.now()
    if not SigningRequest.objects.filter(nonce=str(nonce)[:64], user=user, action__isnull=False, used_at__isnull=True,
                                         expires_at__gt=now).update(used_at=now):
        raise ActionRefused("This signing request is unknown, already used or expired; start again.")
    request = SigningRequest.objects.get(nonce=nonce)
    action = ActionRequest.objects.select_related("agent", "server").get(pk=request.action_id)
    refusal = action_refusal(action=action, user=user)
    if refusal:
        raise ActionRefused(refusal)
    if action.expires_at <= now:
        raise ActionRefused("This held call has expired; the agent must ask again.")
    passkey = Passkey.objects.active().filter(user=user, credential_id=passkeys.credential_id_of(credential)).first()
    if passkey is None:
        raise ActionRefused("That passkey is not one of your active passkeys.")
    try:
        new_count = passkeys.verify_assertion(rp=relying_party(), credential=credential,
                                              challenge=base64url_to_bytes(request.challenge),
                                              public_key=passkey.public_key, sign_count=passkey.sign_count)
    except passkeys.PasskeyRefused as refused:
        raise ActionRefused(refused.message) from None
    with transaction.atomic():
        locked = ActionRequest.objects.select_for_update().get(pk=action.pk)
        if locked.state != ActionRequest.State.PENDING or locked.digest != request.digest:
            raise ActionRefused("This call was decided a moment ago; nothing was signed.")
        Passkey.objects.filter(pk=passkey.pk).update(sign_count=new_count, last_used_at=now)
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
            names = approvals.values_list("approver__username", flat=True) if locked.state == "approved" else [
                user.get_username()]
            locked.decided_at, locked.decided_by = now, ", ".join(sorted(names))
            locked.save(update_fields=["state", "decided_at", "decided_by", "decision_reason"])
        if locked.run_id:
            journal_services.record_event(run_id=locked.run_id, event="action_decision", now=now, data={
                "action": str(locked.public_id), "decision": approval.decision, "by": user.get_username(),
                "passkey": passkey.credential_id, "digest": approval.digest, "nonce": approval.nonce,
                "reason": approval.reason or None, "state": locked.state})
    return approval
