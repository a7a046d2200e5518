"""Reversal plans: asking for one, its rounds of checks against the tool servers, and cancelling it.

Rule of the house: no outside I/O inside a transaction. Checks talk to tool servers (`approver.checks`)
with no transaction open; each answer is written in its own short transaction as it arrives.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from journal import services as journal_services
from journal.errors import Refused
from journal.models import Agent, Run, Step, StepDependency, ToolServer
from journal.record import idempotency, journaling

from .. import execution, planning, traced
from ..content import plan_content
from ..models import ActionRequest, Plan, PlanItem
from ..models.plans import since_words
from . import bell, leases, nothing_left

# The Step columns planning reads; a 10,000-step run is one query of these.
_FACT_FIELDS = (
    "id", "number", "server_name", "tool", "status", "reversibility", "declaration", "compensation_arguments",
    "compensation_then", "undo_problems", "effect_summary", "effect_resource", "effect_version", "undo_by",
    "finished_at", "request_meta", "failure_class", "arguments", "task_id", "held_end",
)

class PlanRefused(Refused):
    """The request cannot become a plan. `open_plan` is set when a step is already in another open plan."""

    def __init__(self, message: str, *, open_plan: Plan | None = None):
        super().__init__(message)
        self.open_plan = open_plan


def step_facts(run: Run) -> list[planning.StepFacts]:
    """What planning reads of every step of `run`, in order, in three queries whatever the run's size."""
    return facts_of(Step.objects.filter(run=run))


def facts_since(agent: Agent, since: datetime) -> list[planning.StepFacts]:
    """What planning reads of every call `agent` made since `since`, in every run of its own (not an imported
    one), each fact naming its run."""
    return facts_of(_agent_steps(agent, since), across_runs=True)


def facts_of(steps, *, across_runs: bool = False) -> list[planning.StepFacts]:
    """What planning reads of `steps` (a Step queryset), in run and step order."""
    inferred: dict[int, dict[int, tuple]] = {}
    for step_id, earlier, pointers in (
        StepDependency.objects.filter(step__in=steps, rule=StepDependency.Rule.INFERRED)
        .values_list("step_id", "depends_on__number", "pointers")
    ):
        inferred.setdefault(step_id, {})[earlier] = tuple(pointers or ())
    undone = set(
        PlanItem.objects.filter(step__in=steps, outcome="compensated").values_list("step_id", flat=True)
    )
    # A compensation whose outcome is unknown is settled before its step is undone again, by any plan.
    unknown = {step_id: str(plan)[:8] for step_id, plan in PlanItem.objects.filter(
        step__in=steps, outcome=execution.OUTCOME_UNKNOWN).values_list("step_id", "plan__public_id")}
    # What became of each held step's request: its state, and the step that carried it once approved.
    held = {step_id: (state, used) for step_id, state, used in ActionRequest.objects.filter(
        step__in=steps).values_list("step_id", "state", "used_step__number")}
    facts = []
    tools = {server.name: tuple(sorted(server.tool_names)) for server in ToolServer.objects.filter(
        name__in=steps.values("server_name"))}
    for row in steps.order_by("run_id", "number").values(*_FACT_FIELDS, "run_id", "run__public_id"):
        declared = journaling.agent_journal(row["request_meta"]).get("dependsOn")
        facts.append(
            planning.StepFacts(
                id=row["id"],
                number=row["number"],
                server=row["server_name"],
                tool=row["tool"],
                status=row["status"],
                reversibility=row["reversibility"],
                declaration=row["declaration"] or {},
                compensation_arguments=row["compensation_arguments"],
                undo_problems=tuple(row["undo_problems"] or ()),
                effect_summary=row["effect_summary"],
                effect_resource=row["effect_resource"],
                effect_version=row["effect_version"],
                undo_by=row["undo_by"],
                finished_at=row["finished_at"],
                declared_deps=tuple(n for n in declared if isinstance(n, int) and not isinstance(n, bool))
                if isinstance(declared, list)
                else None,
                inferred_deps=inferred.get(row["id"], {}),
                already_undone=row["id"] in undone,
                undo_unknown=unknown.get(row["id"], ""),
                failure_class=row["failure_class"],
                arguments=row["arguments"] if isinstance(row["arguments"], dict) else {},
                server_tools=tools.get(row["server_name"], ()),
                compensation_then=row["compensation_then"],
                task_id=row["task_id"],
                held_end=row["held_end"],
                held_call=held.get(row["id"], ("", None))[0],
                went_out_as=held.get(row["id"], ("", None))[1],
                run_id=row["run_id"],
                run=str(row["run__public_id"]) if across_runs else "",
            )
        )
    return facts


def ask_for_plan(*, run: Run, requested_by, reason: str = "", from_step: int | None = None,
                 steps: list[int] | None = None, now: datetime | None = None) -> Plan:
    """What the run page does: the request is checked and the plan opened at once (`drafting`), and the worker
    drafts it (`draft_plan`), so a 10,000-step run costs the web request a few small queries while the page
    shows how far the drafting got. Refused (PlanRefused) as `request_plan` is."""
    now = now or timezone.now()
    with transaction.atomic():
        plan = _open(
            run=run, requested_by=requested_by, reason=reason, from_step=from_step, steps=steps, now=now
        )
        bell.ring(bell.DRAFT_PLAN, plan.pk)
    return plan


def request_plan(*, run: Run, requested_by, reason: str = "", from_step: int | None = None,
                 steps: list[int] | None = None, now: datetime | None = None, saga: bool = False) -> Plan:
    """Build a reversal plan for `run` here and now (commands, tests, the Recorder's unwinding), from step N
    onwards or for a chosen set of steps, and queue its checks. Refused (PlanRefused) when the selection is
    empty or unknown, or when a step in it is already in an open plan; nothing is kept then. `saga`: opened
    by a saga policy after a failed call."""
    now = now or timezone.now()
    plan = _open(run=run, requested_by=requested_by, reason=reason, from_step=from_step, steps=steps, now=now,
                 saga=saga)
    return _draft_now(plan, now)


def ask_to_undo_since(*, agent: Agent, since: datetime, requested_by, reason: str = "",
                      now: datetime | None = None) -> Plan:
    """What the agent page does: undo everything `agent` did since `since`, across its runs, in one plan
    with the same checks and sign-off as a run's. Opened at once and drafted by the worker, as
    `ask_for_plan`'s are. Refused (PlanRefused) when it did nothing since then, or when one of those steps is
    already in an open plan."""
    now = now or timezone.now()
    with transaction.atomic():
        plan = _open_since(agent=agent, since=since, requested_by=requested_by, reason=reason, now=now)
        bell.ring(bell.DRAFT_PLAN, plan.pk)
    return plan


def request_plan_since(*, agent: Agent, since: datetime, requested_by, reason: str = "",
                       now: datetime | None = None) -> Plan:
    """`ask_to_undo_since` drafted here and now (commands, tests), as `request_plan` is."""
    now = now or timezone.now()
    plan = _open_since(agent=agent, since=since, requested_by=requested_by, reason=reason, now=now)
    return _draft_now(plan, now)


def _draft_now(plan: Plan, now: datetime) -> Plan:
    try:
        return _draft(plan, claimed=_claim_draft(plan, now), now=now)
    except PlanRefused:
        Plan.objects.filter(pk=plan.pk).delete()  # never a plan: its items went with it
        raise


def _agent_steps(agent: Agent, since: datetime):
    return Step.objects.filter(run__agent=agent, started_at__gte=since).exclude(run__state=Run.State.IMPORTED)


def _open_since(*, agent: Agent, since: datetime, requested_by, reason: str, now: datetime) -> Plan:
    """Check the request without reading every step, and open the plan as `drafting` on the run of the first
    call since the moment (its record takes the plan's events; drafting adds the other runs)."""
    if since > now:
        raise PlanRefused(f"{since_words(since)} is still to come: say a moment in the past.")
    first = _agent_steps(agent, since).order_by("started_at", "id").select_related("run").first()
    if first is None:
        raise PlanRefused(f"{agent.name} made no calls since {since_words(since)}: there is nothing to undo.")
    refuse_if_held_steps(_agent_steps(agent, since).values_list("id", flat=True))
    plan = traced.new_plan(
        run=first.run, since=since, requested_by=requested_by, reason=reason.strip(), created_at=now,
        updated_at=now, state=Plan.State.DRAFTING)
    plan.runs.add(first.run)
    return plan


def _open(*, run: Run, requested_by, reason: str, from_step: int | None, steps: list[int] | None,
          now: datetime, saga: bool = False) -> Plan:
    """Check what can be checked without reading the whole run, and open the plan as `drafting`."""
    if run.state == Run.State.IMPORTED:
        raise PlanRefused(
            f"This run was imported{' from ' + run.imported_from if run.imported_from else ''}: its "
            "record is kept here as it came, and its actions are undone where they ran."
        )
    if (from_step is None) == (not steps):
        raise PlanRefused("Say where to undo from (a step number), or which steps to undo.")
    asked = Step.objects.filter(run=run)
    asked = (
        asked.filter(number__gte=from_step) if from_step is not None else asked.filter(number__in=set(steps))
    )
    known = set(asked.values_list("number", flat=True)) if steps else set()
    if from_step is not None and not asked.exists():
        raise PlanRefused(f"The run has no step {from_step}.")
    if steps and (missing := sorted(set(steps) - known)):
        raise PlanRefused(f"The run has no step {', '.join(map(str, missing))}.")
    refuse_if_held_steps(asked.values_list("id", flat=True))
    plan = traced.new_plan(
        run=run, requested_by=requested_by, reason=reason.strip(), from_step=from_step,
        chosen_steps=sorted(set(steps)) if from_step is None else [], created_at=now, updated_at=now,
        state=Plan.State.DRAFTING, saga=saga)
    plan.runs.add(run)
    return plan


# A draft's items are written this many at a time, each batch in its own short transaction, so the page can
# show the progress and no transaction holds the database for seconds.
DRAFT_BATCH = 1000
# A draft that has not moved for this long was left by a worker that died: another may start it again.
DRAFT_STALE = timedelta(minutes=2)


def draft_plan(*, plan: Plan, now: datetime | None = None) -> Plan:
    """The worker's part of a plan request (`ask_for_plan`): read the run's steps, add every later step that
    depends on a chosen one, write the items (the page shows how many), then queue the checks. Safe to run
    twice: one worker drafts a plan at a time (a conditional update claims it), and a draft a dead worker
    left is started again from nothing. A request that cannot become a plan (a step taken by another plan
    meanwhile) ends the plan as cancelled, saying why."""
    now = now or timezone.now()
    claimed = _claim_draft(plan, now)
    if claimed is None:
        return Plan.objects.get(pk=plan.pk)
    try:
        return _draft(plan, claimed=claimed, now=now)
    except PlanRefused as refused:
        with transaction.atomic():
            if Plan.objects.filter(pk=plan.pk, state=Plan.State.DRAFTING, drafting_since=claimed).update(
                    state=Plan.State.CANCELLED, stop_reason=refused.message, updated_at=timezone.now()):
                PlanItem.objects.filter(plan_id=plan.pk).delete()
        return Plan.objects.get(pk=plan.pk)


def _claim_draft(plan: Plan, now: datetime) -> datetime | None:
    """Take the drafting of `plan` for this worker: the moment of the claim, or None if another has it."""
    claimed = timezone.now()
    fresh = Q(drafting_since__isnull=True) | Q(updated_at__lt=now - DRAFT_STALE)
    if not Plan.objects.filter(fresh, pk=plan.pk, state=Plan.State.DRAFTING).update(
            drafting_since=claimed, draft_done=0, updated_at=claimed):
        return None
    PlanItem.objects.filter(plan_id=plan.pk).delete()  # what a dead worker left, if anything
    return claimed


def _draft(plan: Plan, *, claimed: datetime, now: datetime) -> Plan:
    plan = Plan.objects.select_related("run__agent", "requested_by", "rest_of").get(pk=plan.pk)
    drafts = _drafts(plan, now)
    mine = Plan.objects.filter(pk=plan.pk, state=Plan.State.DRAFTING, drafting_since=claimed)
    mine.update(draft_total=len(drafts))
    records = _recipe_records(drafts)
    for start in range(0, len(drafts), DRAFT_BATCH):
        rows = [_item_row(plan, draft, records) for draft in drafts[start:start + DRAFT_BATCH]]
        try:
            with transaction.atomic():
                if not mine.select_for_update().exists():  # cancelled meanwhile, or taken over
                    return Plan.objects.get(pk=plan.pk)
                PlanItem.objects.bulk_create(rows, batch_size=500)
                mine.update(draft_done=F("draft_done") + len(rows), updated_at=timezone.now())
        except IntegrityError:
            # Another plan took one of these steps since we looked.
            refuse_if_held_steps([d.step.id for d in drafts], mine=plan)
            raise PlanRefused(
                "Another plan for these steps was being made at the same moment; try again."
            ) from None
    return _finish_draft(plan, drafts, claimed=claimed, now=now)


def _drafts(plan: Plan, now: datetime) -> list[planning.ItemDraft]:
    """The plan's items: the chosen steps and every later one depending on them, or
    (a plan since a moment) every call the agent made since then, in all its runs."""
    secret = idempotency.secret(settings.SECRET_KEY)
    if plan.rest_of_id is not None:
        return _rest_drafts(plan, secret, now)
    if plan.since is not None:
        facts = facts_since(plan.run.agent, plan.since)
        refuse_if_held_steps([s.id for s in facts])
        return planning.draft_items_since(facts, plan_id=str(plan.public_id), key_secret=secret, now=now)
    facts = step_facts(plan.run)
    chosen = {s.number for s in facts if s.number >= plan.from_step} if plan.from_step is not None \
        else set(plan.chosen_steps)
    try:
        pulled = planning.closure(facts, chosen)
    except planning.PlanningError as exc:
        raise PlanRefused(str(exc)) from None
    refuse_if_held_steps([s.id for s in facts if s.number in pulled])
    return planning.draft_items(facts, pulled, plan_id=str(plan.public_id), key_secret=secret, now=now)


def _rest_drafts(plan: Plan, secret: bytes, now: datetime) -> list[planning.ItemDraft]:
    """The rest of a plan that stopped short: the steps it did not undo, and in each of their runs every
    later step that depends on one of them (the agent may have gone on since). A step undone meanwhile is
    drafted as already undone, so nothing is done twice."""
    first = plan.rest_of
    left = set(first.not_yet_undone().values_list("step_id", flat=True))
    facts = facts_of(Step.objects.filter(run__in=first.runs.all()), across_runs=first.since is not None)
    pulls: dict[int, planning.Pull] = {}
    for run_id in sorted({f.run_id for f in facts}):
        in_run = [f for f in facts if f.run_id == run_id]
        chosen = {f.number for f in in_run if f.id in left}
        if chosen:
            pulled = planning.closure(in_run, chosen)
            pulls.update({f.id: pulled[f.number] for f in in_run if f.number in pulled})
    if not pulls:
        raise PlanRefused(f"Plan {str(first.public_id)[:8]} has nothing left to undo.")
    refuse_if_held_steps(list(pulls))
    return planning.draft_items_pulled(facts, pulls, plan_id=str(plan.public_id), key_secret=secret, now=now)


def _finish_draft(plan: Plan, drafts: list[planning.ItemDraft], *, claimed: datetime, now: datetime) -> Plan:
    """Every item is written: the plan's content gets its digest, the request goes on the record of each run
    it covers, and the checks are queued (a plan with nothing left to undo ends here instead)."""
    compensate = sum(d.action == PlanItem.Action.COMPENSATE for d in drafts)
    with transaction.atomic():
        if not Plan.objects.select_for_update().filter(
                pk=plan.pk, state=Plan.State.DRAFTING, drafting_since=claimed).exists():
            return Plan.objects.get(pk=plan.pk)
        plan.checks_total = plan.compensate_count = compensate
        plan.cannot_undo_count = sum(d.action == PlanItem.Action.CANNOT_UNDO for d in drafts)
        plan.state, plan.updated_at = Plan.State.CHECKING, timezone.now()
        plan.check_round += 1  # drafted again (`following`), a plan's checks go on from its last round
        plan.draft_total = plan.draft_done = len(drafts)
        plan.digest = planning.digest(plan_content(plan))
        plan.save(
            update_fields=[
                "checks_total",
                "compensate_count",
                "cannot_undo_count",
                "state",
                "check_round",
                "updated_at",
                "draft_total",
                "draft_done",
                "digest",
            ]
        )
        runs = sorted({plan.run_id, *(d.step.run_id for d in drafts)})  # locked in one order: no deadlock
        plan.runs.add(*runs)
        for run_id in runs:
            journal_services.record_event(
                run_id=run_id,
                event="plan",
                now=now,
                data={
                    "plan": str(plan.public_id),
                    "requestedBy": plan.requested_by.get_username(),
                    "reason": plan.reason,
                    "selection": plan.selection_text,
                    "items": len(drafts),
                    "digest": plan.digest,
                    **({"runs": len(runs)} if plan.since else {}),
                    **({"restOf": str(plan.rest_of.public_id)} if plan.rest_of_id else {}),
                },
            )
        if compensate or plan.cannot_undo_count:  # what cannot be undone, a person reads and signs for
            bell.ring(bell.CHECK_PLAN, plan.pk, plan.check_round)
        else:  # nobody signs nothing: everything was undone already or changed nothing; it ends now
            nothing_left.end_at_once(plan, now=now)
    return plan


def refuse_if_held_steps(step_ids, *, mine: Plan | None = None) -> None:
    held = (
        PlanItem.objects.filter(step_id__in=step_ids, holds_step=True)
        .exclude(plan=mine)
        .select_related("plan", "step")
        .order_by("step__number")
        .first()
    )
    if held is not None:
        raise PlanRefused(
            f"Step {held.step.number} is already in an open plan ({held.plan.get_state_display().lower()}); "
            "finish or cancel that plan first.", open_plan=held.plan)


def _recipe_records(drafts: list[planning.ItemDraft]) -> dict[int, str]:
    """The record each recipe undo changes, when its step names none: the read the recipe made of it."""
    ids = [d.step.id for d in drafts if d.dialect == planning.RECIPE and not d.step.effect_resource]
    return {step_id: planning.record_key(tool, arguments) for step_id, tool, arguments in Step.objects.filter(
        id__in=ids).values_list("id", "earlier_state__tool", "earlier_state__arguments") if tool}


def _item_row(plan: Plan, draft: planning.ItemDraft, records: dict[int, str]) -> PlanItem:
    compensate = draft.action == PlanItem.Action.COMPENSATE
    return PlanItem(
        record=(draft.step.effect_resource or records.get(draft.step.id, ""))[:500] if compensate else "",
        plan=plan,
        step_id=draft.step.id,
        position=draft.position,
        action=draft.action,
        rule=draft.pull.rule,
        pulled_in_by=draft.pull.by,
        pointers=list(draft.pull.pointers),
        tool=draft.tool,
        arguments=draft.arguments,
        then=draft.then or [],
        if_version=draft.if_version,
        idempotency_key=draft.idempotency_key,
        dialect=draft.dialect,
        via=draft.via,
        side_effect=draft.side_effect,
        cost=draft.cost,
        undo_by=draft.undo_by,
        needs_human=draft.needs_human,
        reason=draft.reason,
        remedy=draft.remedy,
        check_status=PlanItem.Check.PENDING
        if draft.action == PlanItem.Action.COMPENSATE
        else PlanItem.Check.NOT_NEEDED,
    )



def cancel_plan(*, plan: Plan, by, now: datetime | None = None) -> bool:
    """Close an open plan that has not been approved, freeing its steps for another plan."""
    now = now or timezone.now()
    with transaction.atomic():
        cancelled = Plan.objects.filter(pk=plan.pk, state__in=Plan.CANCELLABLE_STATES).update(
            state=Plan.State.CANCELLED, updated_at=now)
        if not cancelled:
            return False
        plan.items.update(holds_step=False)
        leases.release(plan=plan, now=now, why="the plan was cancelled")
        journal_services.record_event(run_id=plan.run_id, event="plan_cancelled", now=now, data={
            "plan": str(plan.public_id), "by": by.get_username()})
    plan.refresh_from_db()
    return True

