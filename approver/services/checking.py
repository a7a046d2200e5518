"""The checks of a plan: each compensate item asked of its tool server, changing nothing, whether its undo
would work now, in rounds (a new round when someone presses "Check again"); results are kept as they arrive,
and the plan is ready, with a digest over them, once every item has its answer."""

from datetime import datetime

import anyio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from journal import services as journal_services
from journal.record import sql
from journal.telemetry import metrics
from journal.undo import recipe_chains
from journal.upstream.captured import CallRows
from journal.upstream.client import Endpoint, Upstreams

from .. import checks, database_checks, planning
from ..checks import CheckResult
from ..content import content_rows, plan_content
from ..models import Plan, PlanItem
from ..policy_book import plan_needs_a_human
from . import bell, following
from .approvals import approve


def queue_checks(*, plan: Plan, now: datetime | None = None, ring: bool = True) -> bool:
    """Start a new round of checks on a draft or ready plan: every compensate item goes back to `pending`
    and the worker is asked once the transaction commits (unless `ring` is False: the caller runs the
    round itself). False if the plan is in no state to be checked."""
    now = now or timezone.now()
    with transaction.atomic():
        claimed = Plan.objects.filter(pk=plan.pk, state__in=Plan.CHECKABLE_STATES).update(
            state=Plan.State.CHECKING, checks_done=0, check_round=F("check_round") + 1, updated_at=now)
        if not claimed:
            return False
        # Conflict choices answered the old results; a new round must be chosen on afresh.
        plan.items.filter(action=PlanItem.Action.COMPENSATE).update(
            check_status=PlanItem.Check.PENDING, check_detail={}, checked_at=None, conflict_choice="",
            override_reason="", override_by=None, override_at=None)
        plan.refresh_from_db()
        if ring:
            bell.ring(bell.CHECK_PLAN, plan.pk, plan.check_round)
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
            sql.update(
                PlanItem,
                item_id,
                {"check_status": result.status, "check_detail": result.detail, "checked_at": now},
                only_if={"check_status": PlanItem.Check.PENDING},
            )
            for item_id, result in results
        )
        if done:
            Plan.objects.filter(pk=plan.pk).update(checks_done=F("checks_done") + done, updated_at=now)


def _left_by_the_run(plan: Plan) -> dict[int, str]:
    """For each undo in the plan whose record the run's later calls in the plan changed again (their undos
    come first): the version the run left it at (`_hatp_left` for a server's own undo; for a recipe, when
    those calls read the same record, `recipe_chains.left_by_the_run`, else `checks.LATER_CHANGES`: it
    cannot be told from here)."""
    return {**_hatp_left(plan), **_recipe_left(plan)}


def _hatp_left(plan: Plan) -> dict[int, str]:
    """For each HATP undo whose record (`PlanItem.record`, on the same server) a later step in the plan
    changed again: the version that latest step left it at."""
    hatp = plan.items.filter(action=PlanItem.Action.COMPENSATE, dialect=planning.HATP).exclude(record="")
    rows = list(hatp.order_by("step__number").values_list("id", "step__server_id", "record",
                                                          "step__effect_version"))
    found = {}
    for n, (item_id, server, record, _) in enumerate(rows):
        later = [left for _, on, other, left in rows[n + 1:] if (on, other) == (server, record) and left]
        if later:
            found[item_id] = later[-1]
    return found


def _recipe_left(plan: Plan) -> dict[int, str]:
    rows = list(plan.items.filter(action=PlanItem.Action.COMPENSATE, dialect=planning.RECIPE).order_by(
        "step__number").values_list("id", "if_version", "step__server_id", "step__earlier_state"))
    keyed = [(item_id, server, earlier or {}, (earlier or {}).get("version"), after)
             for item_id, after, server, earlier in rows]
    found = {}
    for n, (item_id, server, earlier, _, after) in enumerate(keyed):
        key = recipe_chains.read_key(earlier)
        later = [(recipe_chains.read_key(other), before, left, other)
                 for _, on, other, before, left in keyed[n + 1:]
                 if on == server and before and before != left
                 and recipe_chains.reads_overlap(earlier, other)]
        if not (after and later):
            continue
        if left := _as_last_read(earlier, key, later[-1]):
            found[item_id] = left
            continue
        same = [(before, left) for other, before, left, _ in later if other == key and key]
        left = recipe_chains.left_by_the_run(after, same) if same else after
        found[item_id] = left if left != after or len(same) == len(later) else checks.LATER_CHANGES
    return found


def _as_last_read(earlier: dict, key: str, last: tuple) -> str:
    """Where the run left a record, compared the way `earlier` reads it, when the last of the run's later
    calls to it read it the same way and kept what it found after the call ("" otherwise): its version may
    be of another part of the record (the relations, where this one's is of the entities)."""
    last_key, _, _, last_earlier = last
    if not key or last_key != key:
        return ""
    return recipe_chains.version_of_state(last_earlier.get("left"), earlier)


def _chained_rows(plan: Plan) -> dict[int, list[CallRows]]:
    """For each database undo of the plan, the rows of the undos that run before it on the same database,
    the one run last first: where they changed its rows too, it finds them as they leave them (the row
    before the plan's later call that changed it): {item id: [their rows]}."""
    chained, before = {}, {}
    items = plan.items.filter(action=PlanItem.Action.COMPENSATE, dialect=planning.DATABASE).order_by(
        "position").values("id", "step__earlier_state", "step__server_id")
    for item in items:
        rows, _ = database_checks.rows_of(item["step__earlier_state"])
        earlier_ones = before.setdefault(item["step__server_id"], [])
        if earlier_ones:
            chained[item["id"]] = list(reversed(earlier_ones))
        if rows is not None:
            earlier_ones.append(rows)
    return chained


def run_checks(*, plan: Plan, check_round: int, now: datetime | None = None) -> Plan | None:
    """Check every item of this round still `pending` against its server, keeping results as they arrive,
    then mark the plan ready. Safe to run twice (a worker that died is simply asked again): answered items
    are not asked again. None when the plan has moved on from this round."""
    now = now or timezone.now()
    if not Plan.objects.filter(pk=plan.pk, state=Plan.State.CHECKING, check_round=check_round).exists():
        return None
    rows = plan.items.filter(action=PlanItem.Action.COMPENSATE, check_status=PlanItem.Check.PENDING).values(
        "id",
        "dialect",
        "tool",
        "arguments",
        "if_version",
        "idempotency_key",
        "undo_by",
        "step__earlier_state",
        "step__effect_fields",
        "step__server__name",
        "step__server__transport",
        "step__server__url",
        "step__server__command",
        "step__server__database",
    )
    targets, orphans = [], []
    chained = _chained_rows(plan)
    endpoints: dict[tuple, Endpoint] = {}
    run_left = _left_by_the_run(plan)
    for row in rows:
        if row["step__server__name"] is None:
            orphans.append(
                (
                    row["id"],
                    CheckResult("unavailable", {"message": "The tool server is no longer registered."}),
                )
            )
            continue
        where = (row["step__server__name"], row["step__server__transport"], row["step__server__url"],
                 row["step__server__command"])
        endpoint = endpoints.setdefault(where, Endpoint(*where))
        targets.append(
            checks.CheckTarget(
                item_id=row["id"],
                endpoint=endpoint,
                dialect=row["dialect"],
                tool=row["tool"],
                arguments=row["arguments"] or {},
                if_version=row["if_version"],
                idempotency_key=row["idempotency_key"],
                undo_by=row["undo_by"],
                earlier=row["step__earlier_state"],
                run_left=run_left.get(row["id"], ""),
                effect_fields=row["step__effect_fields"],
                database=row["step__server__database"] or "",
                chained=chained.get(row["id"]),
            )
        )
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
            await checks.check_all(
                targets,
                upstreams=upstreams,
                now=now,
                per_server=settings.PLAN_CHECKS_PER_SERVER,
                timeout=settings.TOOL_SERVER_TIMEOUT,
                on_result=on_result,
            )


def finish_checks(*, plan: Plan, check_round: int, now: datetime | None = None) -> Plan:
    """Every item of the round has an answer: the plan is ready, with a digest over the new results."""
    now = now or timezone.now()
    with transaction.atomic():
        plan = Plan.objects.select_for_update(of=("self",)).select_related("run", "requested_by").get(
            pk=plan.pk)
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
        for result, count in counts.items():
            metrics.counted(metrics.CHECKS, result, count)
        if not plan_needs_a_human(plan):
            # Everything in it can be taken back through the API, unchanged since, at no cost, and the
            # policies say such plans need no human: it runs at once, and says so in the record.
            approve(plan=plan, approvers=None, now=now)
            return plan
        bell.ring(bell.NOTIFY_PLAN_READY, plan.pk, plan.check_round)
    return plan


def check_again(*, plan: Plan, by) -> str:
    """What "Check again" does: a plan drafted on a held step that has moved on since is drawn again
    ("redrafted", `following`); any other checkable plan gets a new round of checks ("checking"); "" when
    it cannot be checked now."""
    if plan.state in Plan.CHECKABLE_STATES and following.held_steps_moved_on(plan) and following.redraft(
            plan_id=plan.pk, why=f"{by.get_username()} checked again after a held call moved on"):
        return "redrafted"
    return "checking" if queue_checks(plan=plan) else ""
