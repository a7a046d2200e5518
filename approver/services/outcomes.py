"""Compensations whose outcome nobody knows (the server may have acted without answering): a human asks
the server again, settles it by hand, or has it tried again with the same idempotency key. None of these
ever repeats a compensation blindly."""

from datetime import datetime
from typing import Any

import anyio
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from journal import services as journal_services
from journal.errors import Refused
from journal.upstream.client import Upstreams, endpoint_of

from .. import answers, checks, execution, planning
from ..checks import CheckResult
from ..models import Plan, PlanItem
from .executor import (
    ExecutionStopped,
    compensation_call,
    enter_executing,
    qualifies,
    queue_execution,
    recount,
)


class NotSettled(Refused):
    """A request about an unknown outcome that cannot be taken now; `message` says why."""


def _unknown_item(plan: Plan, position: int) -> PlanItem:
    item = plan.items.filter(position=position).select_related("step__server").first()
    if item is None or item.outcome != execution.OUTCOME_UNKNOWN or item.exec_state != PlanItem.Exec.DONE:
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
        if not PlanItem.objects.filter(pk=item.pk, outcome=execution.OUTCOME_UNKNOWN).update(
            outcome_detail=detail
        ):
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
        if locked.state not in Plan.FINISHED_STATES:
            raise NotSettled(
                f"The plan is {locked.get_state_display().lower()}; settle it once it has finished."
            )
        detail = {**(item.outcome_detail or {}), "message": words.format(who=by.get_username()),
                  "settledBy": by.get_username(), "settledAt": now.isoformat()}
        if not PlanItem.objects.filter(pk=item.pk, outcome=execution.OUTCOME_UNKNOWN).update(
                outcome=outcome, outcome_detail=detail):
            raise NotSettled("That item's outcome was settled a moment ago; reload the report.")
        recount(plan=locked, now=now)
        journal_services.record_event(
            run_id=plan.run_id,
            event="outcome_settled",
            now=now,
            data={
                "plan": str(plan.public_id),
                "step": item.step.number,
                "outcome": outcome,
                "by": by.get_username(),
            },
        )
    return locked


def retry_unknown(*, plan: Plan, position: int, by, now: datetime | None = None) -> None:
    """Run a compensation whose outcome is unknown again, with the same idempotency key (a server that honours
    it returns the first outcome instead of acting twice). A human asks for this after looking; the plan
    runs again for this one item, with its approvals re-checked first."""
    now = now or timezone.now()
    item = _unknown_item(plan, position)
    try:
        qualifies(plan, now)
    except ExecutionStopped as stopped:
        raise NotSettled(f"The approvals no longer hold ({stopped.message}); request a new plan.") from None
    try:
        with transaction.atomic():
            locked = Plan.objects.select_for_update().get(pk=plan.pk)
            if locked.state not in Plan.FINISHED_STATES or locked.stop_reason:
                raise NotSettled(
                    f"The plan is {locked.get_state_display().lower()}"
                    f"{' and was stopped' if locked.stop_reason else ''}; it cannot run this again."
                )
            if not PlanItem.objects.filter(pk=item.pk, outcome=execution.OUTCOME_UNKNOWN).update(
                    exec_state=PlanItem.Exec.NOT_STARTED, outcome="", holds_step=True,
                    outcome_detail={"previous": item.outcome_detail, "retriedBy": by.get_username()}):
                raise NotSettled("That item's outcome was settled a moment ago; reload the report.")
            enter_executing(plan=locked, from_states=Plan.FINISHED_STATES, now=now, execution_summary="")
            journal_services.record_event(run_id=plan.run_id, event="compensation_retried", now=now, data={
                "plan": str(plan.public_id), "step": item.step.number, "by": by.get_username(),
                "idempotencyKey": item.idempotency_key})
            queue_execution(plan=plan)
    except IntegrityError:
        raise NotSettled(
            f"Step {item.step.number} is in another open plan now; finish that one first."
        ) from None
