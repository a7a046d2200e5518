"""Record leases between plans (docs/undo.md, "Two plans, one record").

From its first approval until it ends, a plan holds a lease on each record it will change: an item's
`record` (its step's `effect.resource`, or the read an admin's recipe made of the record) on the step's
server. A plan that asks for a record another plan holds waits in line for it, and its item on that record
does not run until the lease is handed to it; it is then checked again with the server before anything is
sent, since the holder may have changed the record meanwhile. A lease is released when its plan ends, is
cancelled or rejected, when the approvals that took it expire, or when an admin breaks it with a reason;
the next plan in line is handed the record and rung. Every step is on the chains of both plans involved.

At most one plan holds a record: a partial unique index settles two plans approved at the same moment.
"""

from datetime import datetime, timedelta

import anyio
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from journal import services as journal_services
from journal.upstream.client import Upstreams, endpoint_of

from .. import answers, checks, execution
from ..models import Plan, PlanItem, RecordLease
from . import bell, webhooks


class LeaseRefused(ValueError):
    """A lease cannot be broken as asked; `message` says why."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def records_of(plan: Plan) -> list[tuple[str, str]]:
    """The records `plan` will change: (server, record) of each compensation not yet run, sorted."""
    rows = (plan.items.filter(action=PlanItem.Action.COMPENSATE, exec_state=PlanItem.Exec.NOT_STARTED)
            .exclude(record="").exclude(conflict_choice=PlanItem.Choice.KEEP_NEWER)
            .values_list("step__server_name", "record"))
    return sorted(set(rows))


def take(*, plan: Plan, now: datetime, until: datetime | None = None) -> None:
    """At an approval: a lease on each record the plan will change and has none on yet, or its place in line
    behind the plan that holds it. Runs in the caller's transaction."""
    asked = set(plan.leases.open().values_list("server", "resource"))
    for server, resource in records_of(plan):
        if (server, resource) not in asked:
            _ask(plan, server, resource, now=now, until=lapses(now, until))


def lapses(now: datetime, until: datetime | None = None) -> datetime:
    """When a lease asked for now lapses if its plan is not executing then: `RECORD_LEASE_MINUTES` from now,
    or sooner when the approvals that took it expire sooner. One approval of two, an approved plan the worker
    has not started, a paused plan: none keeps a record from other plans for longer (a plan that runs later
    asks again, and waits in line if it must)."""
    bound = now + timedelta(minutes=settings.RECORD_LEASE_MINUTES)
    return min(until, bound) if until is not None else bound


def _holder(server: str, resource: str, *, besides: Plan) -> RecordLease | None:
    return (RecordLease.objects.held().filter(server=server, resource=resource).exclude(plan=besides)
            .select_related("plan__run", "plan__requested_by").first())


def _ask(plan: Plan, server: str, resource: str, *, now: datetime, until: datetime | None) -> RecordLease:
    holder = _holder(server, resource, besides=plan)
    if holder is None:
        try:
            with transaction.atomic():
                lease = RecordLease.objects.create(plan=plan, server=server, resource=resource, asked_at=now,
                                                   held_since=now, until=until)
        except IntegrityError:  # another plan took it at this very moment
            holder = _holder(server, resource, besides=plan)
        else:
            _journal("lease_taken", lease, now)
            return lease
    lease = RecordLease.objects.create(plan=plan, server=server, resource=resource, asked_at=now, until=until,
                                       waited=True)
    _journal("lease_waiting", lease, now, other=holder.plan if holder else None)
    return lease


def _journal(event: str, lease: RecordLease, now: datetime, *, other: Plan | None = None, **data) -> None:
    """A lease's step, on the chain of its plan's run and of the other plan's (when there is one)."""
    entry = {"plan": str(lease.plan.public_id), "server": lease.server, "resource": lease.resource,
             **({"otherPlan": str(other.public_id)} if other else {}), **data}
    for run_id in sorted({lease.plan.run_id, *([other.run_id] if other else [])}):
        journal_services.record_event(run_id=run_id, event=event, now=now, data=entry)


def wait_for(*, plan: Plan, item: PlanItem, now: datetime) -> RecordLease | None:
    """Before an item runs: None when it may (it changes no record, or its plan holds the record, taking it
    now if it is free); else the lease of the plan that holds the record, and this plan waits in line."""
    if item.action != PlanItem.Action.COMPENSATE or not item.record \
            or item.conflict_choice == PlanItem.Choice.KEEP_NEWER:
        return None
    with transaction.atomic():
        holder = _hold_or_line(plan, item.step.server_name, item.record, now)
        if holder is not None:
            _unless_each_other(plan, holder, now)
        return holder


def _hold_or_line(plan: Plan, server: str, record: str, now: datetime) -> RecordLease | None:
    mine = plan.leases.open().filter(server=server, resource=record).first()
    if mine is not None and mine.is_held:
        return None
    holder = _holder(server, record, besides=plan)
    if holder is not None:
        if mine is None:
            _ask(plan, server, record, now=now, until=lapses(now))
        return holder
    if mine is None:
        mine = _ask(plan, server, record, now=now, until=lapses(now))
        return None if mine.is_held else _holder(server, record, besides=plan)
    return None if _hand_to(mine, now) else _holder(server, record, besides=plan)


def _unless_each_other(plan: Plan, holder: RecordLease, now: datetime) -> None:
    """`plan` is about to wait for `holder`'s record. If `holder`'s plan waits, directly or behind other
    plans, for a record `plan` holds, they would wait for each other forever (an executing plan's leases do
    not lapse): `plan` gives those records up, each to the next plan in line, and asks for them again at the
    end of the line (so its items on them are checked again before they run)."""
    given = _held_for(plan, holder)
    for lease in given:
        _release(lease, now=now, why=f"given up to plan {str(holder.plan.public_id)[:8]}: the two plans "
                                     "waited for each other's records")
    if given:
        take(plan=plan, now=now)


def _held_for(plan: Plan, holder: RecordLease) -> list[RecordLease]:
    """The leases `plan` holds that `holder`'s plan waits for, directly or behind the plans it waits for."""
    mine, seen, frontier = [], {plan.pk}, {holder.plan_id}
    while frontier:
        seen |= frontier
        waits = set(RecordLease.objects.open().filter(plan_id__in=frontier, held_since__isnull=True)
                    .values_list("server", "resource"))
        frontier = set()
        for held in RecordLease.objects.held().filter(resource__in={r for _, r in waits}).select_related(
                "plan__run"):
            if (held.server, held.resource) not in waits:
                continue
            if held.plan_id == plan.pk:
                mine.append(held)
            elif held.plan_id not in seen:
                frontier.add(held.plan_id)
    return mine


def _hand_to(lease: RecordLease, now: datetime, *, released: RecordLease | None = None) -> bool:
    """A waiting lease becomes the holder (False if another plan took the record first)."""
    try:
        with transaction.atomic():
            if not RecordLease.objects.filter(pk=lease.pk, released_at__isnull=True, held_since__isnull=True
                                              ).update(held_since=now):
                return False
    except IntegrityError:
        return False
    lease.held_since = now
    _journal("lease_taken", lease, now, other=released.plan if released else None)
    if released is not None and lease.plan.state in Plan.RUNNABLE_STATES:
        bell.ring(bell.EXECUTE_PLAN, lease.plan_id)  # its item waited for this record
    return True


def release(*, plan: Plan, now: datetime, why: str) -> None:
    """The plan ended, was cancelled or rejected: each of its leases is released, and each record it held is
    handed to the next plan in line. Runs in the caller's transaction."""
    for lease in plan.leases.open().select_related("plan__run"):
        _release(lease, now=now, why=why)


def _release(lease: RecordLease, *, now: datetime, why: str, **fields) -> bool:
    if not RecordLease.objects.filter(pk=lease.pk, released_at__isnull=True).update(
            released_at=now, released_why=why, **fields):
        return False
    held = lease.held_since is not None
    line = list(RecordLease.objects.open().filter(
        server=lease.server, resource=lease.resource, held_since__isnull=True).exclude(plan=lease.plan)
        .select_related("plan__run").order_by("asked_at", "id")) if held else []
    _journal("lease_released", lease, now, other=line[0].plan if line else None, why=why, held=held,
             **({"by": fields["broken_by"].get_username(), "reason": fields["break_reason"]}
                if "broken_by" in fields else {}))
    for waiting in line:  # handed to the first plan in line that can take it
        if _hand_to(waiting, now, released=lease):
            break
    return True


def break_lease(*, lease: RecordLease, by, reason: str, now: datetime | None = None) -> None:
    """An admin breaks a lease, saying why: the record goes to the next plan in line (which checks it again
    before it runs), and both chains say who broke it and why. The caller checked that `by` is an admin."""
    now = now or timezone.now()
    reason = (reason or "").strip()
    if not reason:
        raise LeaseRefused("Say why the lease is broken: the plans' records keep it.")
    if len(reason) > 1000:
        raise LeaseRefused("Keep the reason under 1000 characters.")
    with transaction.atomic():
        lease = RecordLease.objects.select_for_update(of=("self",)).select_related("plan__run").get(
            pk=lease.pk)
        if not lease.is_held:
            raise LeaseRefused("This lease is not held any more: nothing was broken.")
        _release(lease, now=now, why=f"broken by {by.get_username()}", broken_by=by, break_reason=reason)
        webhooks.emit("lease.broken", {
            "plan": str(lease.plan.public_id), "team": lease.plan.run.team.name, "server": lease.server,
            "resource": lease.resource, "by": by.get_username(), "reason": reason},
            team_id=lease.plan.run.team_id, now=now)


def expire(*, now: datetime | None = None) -> int:
    """Release the leases whose approvals expired, of plans not running an item now (one that is stops on
    its own, its approvals checked before each item, and releases them when it ends)."""
    now = now or timezone.now()
    released = 0
    for lease in (RecordLease.objects.open().filter(until__lt=now).exclude(plan__state=Plan.State.EXECUTING)
                  .select_related("plan__run")):
        with transaction.atomic():
            released += _release(lease, now=now, why="its approvals expired")
    return released


def recheck(*, item: PlanItem, if_version: str) -> execution.Verdict | None:
    """An item whose record another plan held first is checked again with its server before its undo is
    sent, once: a conflict now (the other plan, or anyone, changed the record since the approvers signed)
    leaves the record alone. None: go on (the compensation still carries `ifVersion`)."""
    plan = item.plan
    lease = plan.leases.held().filter(server=item.step.server_name, resource=item.record, waited=True,
                                      rechecked=False).first()
    if lease is None or not RecordLease.objects.filter(pk=lease.pk, rechecked=False).update(rechecked=True):
        return None
    target = checks.CheckTarget(
        item_id=item.pk, endpoint=endpoint_of(item.step.server), dialect=item.dialect, tool=item.tool,
        arguments=item.arguments or {}, if_version=if_version, idempotency_key=item.idempotency_key,
        undo_by=item.undo_by, earlier=item.step.earlier_state, effect_fields=item.step.effect_fields,
        database=item.step.server.database)
    result = anyio.run(_check, target)
    if result.status != "conflict":
        return None
    return execution.Verdict(execution.CONFLICT, {**result.detail, "message": answers.bounded(
        f"Checked again after waiting for another plan's lease on {item.record}: the record changed since "
        "the approvers signed, so nothing was sent.")})


async def _check(target: checks.CheckTarget) -> checks.CheckResult:
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        return await checks.check_one(target, upstreams=upstreams, timeout=settings.TOOL_SERVER_TIMEOUT)


def for_page(plan: Plan, items: list[PlanItem]) -> None:
    """What the plan page says of each item's record: this plan's lease on it (`item.lease`), the plan
    that holds it if another does (`item.held_by`), the plans waiting for it (`item.waiting`), and the
    lease an admin broke, when this plan holds the record no more (`item.broken`)."""
    keys = {(item.step.server_name, item.record) for item in items if item.record}
    if not keys:
        return
    leases = list(RecordLease.objects.open().filter(resource__in={r for _, r in keys})
                  .select_related("plan__run", "plan__requested_by").order_by("asked_at", "id"))
    broken = list(plan.leases.filter(broken_by__isnull=False).select_related("broken_by")
                  .order_by("-released_at"))
    for item in items:
        key = (item.step.server_name, item.record)
        on = [lease for lease in leases if (lease.server, lease.resource) == key]
        item.lease = next((lease for lease in on if lease.plan_id == plan.pk), None)
        item.held_by = next((lease for lease in on if lease.is_held and lease.plan_id != plan.pk), None)
        item.waiting = [lease for lease in on if not lease.is_held and lease.plan_id != plan.pk]
        item.broken = None if item.lease is not None and item.lease.is_held else next(
            (lease for lease in broken if (lease.server, lease.resource) == key), None)
