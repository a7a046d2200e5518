"""Executing an approved plan: its items in order, most recent first, each claimed with a conditional update
and its outcome kept before the next starts; pausing, resuming and aborting it; and picking up what a
killed worker left (the reconciler).

Rule of the house: no outside I/O inside a transaction. A compensation is journaled as a step of the plan's
own compensation run (intent, then outcome), with the tool server called in between, no transaction open.
"""

from datetime import datetime, timedelta
from typing import Any

import anyio
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from journal import services as journal_services
from journal.errors import Refused
from journal.models import Step
from journal.telemetry import metrics, tracing
from journal.undo import declarations
from journal.upstream.client import ToolServerError, Upstreams, endpoint_of

from .. import answers, checks, execution, passkeys, planning, signing, traced
from ..authority import counting_approvals
from ..models import ApprovalRules, Plan, PlanItem
from ..policy_book import plan_needs_a_human
from . import bell, database_undo, leases, recipe_undo
from .if_versions import if_version
from .plans import facts_of

NOT_STARTED, RUNNING, DONE = PlanItem.Exec.NOT_STARTED, PlanItem.Exec.RUNNING, PlanItem.Exec.DONE


class ExecutionStopped(Refused):
    """The plan no longer qualifies to run (its approvals lapsed); `message` says why."""


def queue_execution(*, plan: Plan) -> None:
    """Ring the worker for an approved or executing plan (after the current transaction commits)."""
    bell.ring(bell.EXECUTE_PLAN, plan.pk)


def enter_executing(*, plan: Plan, from_states, now: datetime, only_if: dict | None = None, **fields) -> bool:
    """The one way a plan becomes `executing` (from `from_states`): the worker taking an approved plan, a
    resume, an abort finishing a plan no worker runs, and a human's
    retry of one unknown outcome. A conditional update (on `from_states` and any `only_if` column values):
    False if the plan was not as expected. `fields` are written with the state."""
    return bool(Plan.objects.filter(pk=plan.pk, state__in=from_states, **(only_if or {})).update(
        state=Plan.State.EXECUTING, updated_at=now, **fields))


def qualifies(plan: Plan, now: datetime) -> None:
    if plan.approved_by_policy:
        # No human signed it: the policies let it run alone, and must still, for this exact content.
        refusal = (
            "the plan changed since" if plan.approved_by_policy != plan.digest else plan_needs_a_human(plan)
        )
        if refusal:
            raise ExecutionStopped(f"The policies no longer let this plan run without a human: {refusal}")
        return
    rules = ApprovalRules.of_plan(plan)
    counted = counting_approvals(plan=plan, now=now, rules=rules)
    if len(counted) < rules.quorum:
        raise ExecutionStopped(f"Only {len(counted)} of the {rules.quorum} approvals needed still hold "
                               "(expired, revoked, or the approver may no longer approve).")
    for approval in counted:  # the stored signature still covers the stored fields
        payload = signing.challenge_payload(
            plan=str(plan.public_id),
            digest=approval.digest,
            decision=approval.decision,
            choices=approval.choices,
            nonce=approval.nonce,
        )
        try:
            passkeys.verify_assertion(
                rp=passkeys.this_site(),
                credential=approval.assertion,
                challenge=signing.challenge(payload),
                public_key=approval.passkey.public_key,
                sign_count=0,
            )
        except passkeys.PasskeyRefused:
            raise ExecutionStopped(
                f"{approval.approver.get_username()}'s signature no longer verifies."
            ) from None


def execute_plan(*, plan: Plan, later=None, now=timezone.now) -> Plan:
    """Run an approved plan's items in order, most recent first, each claimed with a conditional update and
    its outcome kept before the next starts. Safe to run twice and after a killed worker: a claimed item is
    never claimed again (`reconcile_execution` deals with one left running). Approvals are re-checked
    before every call; a plan that no longer qualifies stops, and what had not started is skipped.

    A failure that is safe to repeat lets the item go until its backoff is over and asks to be rung again
    then (`later(seconds)`, by default a Celery countdown), so no worker sleeps through a backoff and a
    pause or an abort takes effect before the next try."""
    later = later or (lambda seconds: bell.ring(bell.EXECUTE_PLAN, plan.pk, countdown=seconds))
    if not enter_executing(plan=plan, from_states=Plan.RUNNABLE_STATES, now=now()):
        return Plan.objects.get(pk=plan.pk)
    plan = Plan.objects.select_related("run__agent", "requested_by").get(pk=plan.pk)
    facts = {f.id: f for f in facts_of(Step.objects.filter(run_id__in=plan.items.values("step__run_id")))}
    runs = execution.steps_by_run(facts.values())
    stops: dict[int, set[int]] = {}  # a step that stays (by id) -> the steps (ids) it depends on
    for step_id in plan.items.filter(exec_state=DONE, outcome__in=execution.STOPS_DEPENDENCIES).values_list(
        "step_id", flat=True
    ):
        stops[step_id] = execution.dependencies(facts, step_id, runs)
    while True:
        item = (
            plan.items.filter(exec_state=NOT_STARTED)
            .select_related("step__server", "step__run")
            .order_by("position")
            .first()
        )
        if item is None:
            break
        state, stop_reason = Plan.objects.filter(pk=plan.pk).values_list("state", "stop_reason").get()
        if stop_reason:
            stop_what_is_left(plan, stop_reason, now())
            break
        if state != Plan.State.EXECUTING:
            return Plan.objects.get(pk=plan.pk)  # paused: resuming rings again
        if item.retry_at is not None and item.retry_at > now():
            later((item.retry_at - now()).total_seconds())
            return Plan.objects.get(pk=plan.pk)
        try:
            qualifies(plan, now())
        except ExecutionStopped as stopped:
            stop_what_is_left(plan, stopped.message, now())
            break
        if leases.wait_for(plan=plan, item=item, now=now()) is not None:
            return Plan.objects.get(pk=plan.pk)  # another plan holds its record: handed over, it rings again
        if not _claim(plan, item, now()):
            return Plan.objects.get(pk=plan.pk)  # another worker has an item of this plan in flight
        verdict = _run_item(plan, item, stops, facts)
        if verdict.retry:
            _let_go(item, verdict, now())
            continue
        _keep_outcome(plan, item, verdict, now())
        if verdict.outcome in execution.STOPS_DEPENDENCIES:
            stops[item.step_id] = execution.dependencies(facts, item.step_id, runs)
    return finish_if_done(plan, now())


def _unclaim(item: PlanItem, **fields) -> bool:
    """The one way an item in flight goes back to not started (its next claim tries it again): after a
    failure that is safe to repeat, and when the reconciler finds a repeat safe. A conditional update."""
    return bool(
        PlanItem.objects.filter(pk=item.pk, exec_state=RUNNING).update(exec_state=NOT_STARTED, **fields)
    )


def _let_go(item: PlanItem, verdict: execution.Verdict, now: datetime) -> None:
    """After a failure that is safe to repeat: unclaim the item until its backoff is over, saying why."""
    attempt = item.attempts + 1
    retry_at = now + timedelta(seconds=execution.backoff(attempt))
    _unclaim(item, retry_at=retry_at, outcome_detail={"retrying": {
        **verdict.detail, "attempt": attempt, "of": execution.MAX_ATTEMPTS, "at": retry_at.isoformat()}})


def _claim(plan: Plan, item: PlanItem, now: datetime) -> bool:
    """Claim `item` for this worker, under the plan's row lock, only while the plan is executing and no other
    item of it is in flight: one compensation at a time per plan keeps the reverse order even when two workers
    were rung for the same plan."""
    with transaction.atomic():
        locked = list(
            Plan.objects.select_for_update()
            .filter(pk=plan.pk, state=Plan.State.EXECUTING, stop_reason="")
            .values_list("pk", flat=True)
        )
        if not locked or plan.items.filter(exec_state=RUNNING).exists():
            return False
        if not PlanItem.objects.filter(pk=item.pk, exec_state=NOT_STARTED).update(
                exec_state=RUNNING, attempts=F("attempts") + 1, exec_started_at=now):
            return False
        Plan.objects.filter(pk=plan.pk).update(updated_at=now)  # alive: the reconciler leaves it be
    return True


def _run_item(plan: Plan, item: PlanItem, stops: dict[int, set[int]],
              facts: dict[int, planning.StepFacts]) -> execution.Verdict:
    intent = execution.intent(item.action, item.conflict_choice, item.dialect)
    if intent in (execution.CANNOT, execution.NOTHING):
        return execution.without_compensation(item.action, item.reason)
    if intent == execution.LEAVE:
        return execution.Verdict(
            execution.SKIPPED, {"message": "The approver chose to keep the newer change."}
        )
    blocker = execution.stopped_by(item.step_id, stops)
    if blocker is not None:
        return execution.Verdict(
            execution.SKIPPED,
            {"message": f"Step {facts[blocker].number} was not undone and depends on this one, so this one "
                        "stays too."},
        )
    if item.step.server is None:
        return execution.Verdict(
            execution.COMPENSATION_FAILED, {"message": "The tool server is no longer registered."}
        )
    item.plan = plan
    rechecked = leases.recheck(item=item, if_version=if_version(item))
    return rechecked or _attempt(plan, item, item.attempts + 1)  # this claim's attempt


def _compensation_run(plan: Plan) -> int:
    """The run that journals this plan's compensation calls, created once (under the plan's row lock)."""
    if plan.compensation_run_id:
        return plan.compensation_run_id
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if locked.compensation_run_id is None:
            now = timezone.now()
            locked.compensation_run = journal_services.open_run(
                agent=None,
                key="",
                now=now,
                label=f"Undo of {plan.run.agent_name} (plan {str(plan.public_id)[:8]})",
                team=plan.run.team,
            )
            locked.save(update_fields=["compensation_run"])
    plan.compensation_run_id = locked.compensation_run_id
    return plan.compensation_run_id


def compensation_call(item: PlanItem) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The arguments and request `_meta` of an item's compensation: its ifVersion (the version the approver
    chose to overwrite, when they did) and its stable idempotency key, in the arguments for HATP and in
    `_meta["hatp/journal"]` for the other dialects."""
    contract = {"ifVersion": if_version(item), "idempotencyKey": item.idempotency_key}
    if item.dialect == planning.HATP:
        return {**(item.arguments or {}), **contract}, None
    return dict(item.arguments or {}), {declarations.HATP_KEY: contract}


def _attempt(plan: Plan, item: PlanItem, attempt: int) -> execution.Verdict:
    """One try at an item's compensation: its call (and a recipe's further calls, in order), each journaled
    as a step of the plan's compensation run like any agent's call: the intent before it leaves, what came
    back after. A recipe's undo reads the record first (its server has no conditional write), and nothing is
    sent when it changed since; it counts once the record reads as before, after its last call."""
    if item.dialect == planning.DATABASE:  # the Recorder's own connection, not a tool server's call
        return database_undo.attempt(plan, item, attempt, run_id=_compensation_run(plan))
    earlier, seen = recipe_undo.earlier_read(item), None
    if earlier is not None:
        early, seen = anyio.run(recipe_undo.before, item, earlier)
        if early is not None:
            return early
    arguments, meta = compensation_call(item)
    calls = [(item.tool, arguments, meta), *(
        (call["tool"], call["arguments"], _numbered(meta, n)) for n, call in enumerate(item.then or (), 2))]
    run_id = _compensation_run(plan)
    for n, (tool, arguments, meta) in enumerate(calls, 1):
        verdict = _call(plan, item, run_id, tool, arguments, meta, attempt, first=n == 1)
        if verdict.outcome != execution.COMPENSATED and n > 1:
            return execution.partial_undo(verdict, calls=[call[0] for call in calls], failed=n)
        if verdict.outcome != execution.COMPENSATED:
            return verdict
    if earlier is not None:
        verdict = anyio.run(recipe_undo.after, item, earlier, verdict, seen)
    return verdict


def _numbered(meta: dict[str, Any] | None, n: int) -> dict[str, Any] | None:
    """A further call's `_meta`: the item's idempotency key, numbered for that call."""
    if not meta or declarations.HATP_KEY not in meta:
        return meta
    contract = meta[declarations.HATP_KEY]
    return {declarations.HATP_KEY: {**contract, "idempotencyKey": f"{contract['idempotencyKey']}.{n}"}}


def _call(plan: Plan, item: PlanItem, run_id: int, tool: str, arguments: dict[str, Any],
          meta: dict[str, Any] | None, attempt: int, *, first: bool) -> execution.Verdict:
    started = timezone.now()
    opened = journal_services.open_step_in_run(
        run_id=run_id,
        server=item.step.server,
        tool=tool,
        arguments=arguments,
        request_meta=meta,
        now=started,
        who={
            "executor": "undo",
            "plan": str(plan.public_id),
            "attempt": attempt,
            "undoes": {"run": str(item.step.run.public_id), "step": item.step.number},
        },
    )
    if first:
        PlanItem.objects.filter(pk=item.pk).update(call_step_id=opened.step_id)
    with traced.item_span(f"compensate {tool}", item, **{"undo.attempt": attempt}) as span:
        verdict, outcome = anyio.run(_compensate, item, tool, arguments, meta, attempt)
        if span is not None:
            span.set_attribute("undo.outcome", verdict.outcome)
    journal_services.close_step(opened=opened, outcome=outcome, started=started, finished=timezone.now())
    return verdict


async def _compensate(item: PlanItem, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None,
                      attempt: int) -> tuple[execution.Verdict, journal_services.Outcome]:
    """One compensation call through the one client: the verdict, and what to journal."""
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        endpoint = endpoint_of(item.step.server)
        try:
            result = await upstreams.call_tool(endpoint, tool, arguments, meta=tracing.with_trace(meta))
        except ToolServerError as exc:
            verdict = execution.read_failure(
                failure_class=exc.failure_class, message=exc.message, transient=exc.transient,
                may_have_acted=exc.may_have_acted, repeat_is_safe=item.dialect == planning.HATP,
                attempt=attempt)
            return verdict, journal_services.Outcome(
                error_message=exc.message, failure_class=exc.failure_class, may_have_acted=exc.may_have_acted
            )
        verdict = execution.read_answer(result)
        if item.via == "ui" and verdict.outcome == execution.COMPENSATED:
            verdict = await _postcondition(upstreams, endpoint, item, verdict)
    return verdict, journal_services.Outcome(result=result)


async def _postcondition(upstreams: Upstreams, endpoint, item: PlanItem, verdict: execution.Verdict
                         ) -> execution.Verdict:
    """After a replay through an app's screens, ask `hatp_check` on the same token whether the record shows
    its
    earlier state (the HATP draft's postcondition)."""
    token = {"compensationToken": (item.arguments or {}).get("compensationToken")}
    try:
        check = await upstreams.call_tool(endpoint, checks.HATP_CHECK, token)
    except ToolServerError as exc:
        return execution.Verdict(
            execution.OUTCOME_UNKNOWN,
            {
                **verdict.detail,
                "message": answers.bounded(
                    f"The way back was replayed on {endpoint.name}'s screens, but it could not be asked "
                    f"whether the record "
                    f"shows its earlier state ({exc.message}); check the app."
                ),
            },
        )
    return execution.read_postcondition(verdict, check)


def _keep_outcome(plan: Plan, item: PlanItem, verdict: execution.Verdict, now: datetime) -> None:
    with transaction.atomic():
        kept = PlanItem.objects.filter(pk=item.pk, exec_state=RUNNING).update(
            exec_state=DONE, outcome=verdict.outcome, outcome_detail=verdict.detail, exec_finished_at=now,
            retry_at=None)
        metrics.counted(metrics.COMPENSATIONS, verdict.outcome, kept)
        journal_services.record_event(
            run_id=item.step.run_id,  # the record of the run whose step it undoes
            event="compensation",
            now=now,
            data={
                "plan": str(plan.public_id),
                "step": item.step.number,
                "tool": item.tool or None,
                "arguments": item.arguments if item.action == PlanItem.Action.COMPENSATE else None,
                "idempotencyKey": item.idempotency_key or None,
                "outcome": verdict.outcome,
                "detail": verdict.detail,
                "call": _call_reference(plan, item),
            },
        )


def _call_reference(plan: Plan, item: PlanItem) -> dict[str, Any] | None:
    """Where the item's latest compensation call is journaled: a step of the plan's compensation run."""
    row = (PlanItem.objects.filter(pk=item.pk, call_step__isnull=False)
           .values_list("call_step__run__public_id", "call_step__number").first())
    return {"run": str(row[0]), "step": row[1]} if row else None


def stop_what_is_left(plan: Plan, reason: str, now: datetime) -> None:
    """Nothing more starts. An item waiting to be tried again failed (or, if its last try may have acted,
    nobody knows); what never started is skipped."""
    with transaction.atomic():
        for item in plan.items.filter(exec_state=NOT_STARTED, attempts__gt=0):
            tried = (item.outcome_detail or {}).get("retrying") or {}
            outcome = (
                execution.OUTCOME_UNKNOWN if tried.get("mayHaveActed") else execution.COMPENSATION_FAILED
            )
            stopped = PlanItem.objects.filter(pk=item.pk, exec_state=NOT_STARTED).update(
                exec_state=DONE, outcome=outcome, exec_finished_at=now, retry_at=None,
                outcome_detail={**tried, "message": answers.bounded(
                    f"{tried.get('message') or 'It failed'}; stopped before trying again: {reason}")})
            metrics.counted(metrics.COMPENSATIONS, outcome, stopped)
        skipped = PlanItem.objects.filter(plan=plan, exec_state=NOT_STARTED).update(
            exec_state=DONE, outcome=execution.SKIPPED, outcome_detail={"message": f"Not started: {reason}"},
            exec_finished_at=now)
        metrics.counted(metrics.COMPENSATIONS, execution.SKIPPED, skipped)
        Plan.objects.filter(pk=plan.pk).update(stop_reason=reason)


def _outcome_state(plan: Plan, stop_reason: str) -> tuple[str, str]:
    """The finished plan's state and summary line, from its items' outcomes."""
    outcomes = list(plan.items.order_by("position").values_list("outcome", flat=True))
    return execution.finished_state(outcomes, stopped=bool(stop_reason)), execution.summary_line(outcomes)


def recount(*, plan: Plan, now: datetime, **fields) -> None:
    """The one writer of a finished plan's state and report line, counted from its items' outcomes: after its
    last item, and again when a human settles an unknown one. The caller holds the plan's row lock."""
    plan.state, plan.execution_summary = _outcome_state(plan, plan.stop_reason)
    plan.updated_at = now
    for name, value in fields.items():
        setattr(plan, name, value)
    plan.save(update_fields=["state", "execution_summary", "updated_at", *fields])


def finish_if_done(plan: Plan, now: datetime) -> Plan:
    with transaction.atomic():
        locked = Plan.objects.select_for_update().get(pk=plan.pk)
        if (
            locked.state not in (Plan.State.EXECUTING, Plan.State.PAUSED)
            or plan.items.exclude(exec_state=DONE).exists()
        ):
            return locked  # another worker is still at it, or it is already finished
        recount(plan=locked, now=now, paused_by="", paused_at=None)
        plan.items.update(holds_step=False)
        leases.release(plan=plan, now=now, why="the plan ended")
        journal_services.record_event(run_id=plan.run_id, event="plan_executed", now=now, data={
            "plan": str(plan.public_id), "state": locked.state, "summary": locked.execution_summary,
            "stopReason": locked.stop_reason or None})
        bell.ring(bell.NOTIFY_PLAN_EXECUTED, plan.pk)
    return locked


def reconcile_execution(*, older_than: datetime, now: datetime | None = None) -> list[int]:
    """Pick up what a killed worker left: an item still `running` since before `older_than` is claimed
    again when repeating it is safe (an HATP server honours the idempotency key, so a repeat returns the
    first outcome; a database undo commits with its marker or not at all), and otherwise becomes
    `outcome_unknown` for a human. Returns the plans to ring again."""
    now = now or timezone.now()
    stuck = PlanItem.objects.filter(exec_state=RUNNING, exec_started_at__lt=older_than,
                                    plan__state__in=[Plan.State.EXECUTING, Plan.State.PAUSED]
                                    ).select_related("plan__run", "step")
    for item in stuck:
        if item.dialect in (planning.HATP, planning.DATABASE):
            _unclaim(item)
        else:
            _keep_outcome(item.plan, item, execution.Verdict(execution.OUTCOME_UNKNOWN, {
                "message": "The worker stopped during this compensation and the server may have acted; "
                           "check it before trying again."}), now)
    # An approved plan whose bell was lost (a broker restarted before the worker took it) is rung too.
    return list(Plan.objects.filter(state__in=Plan.RUNNABLE_STATES, updated_at__lt=older_than)
                .values_list("pk", flat=True))
