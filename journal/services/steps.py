"""Runs and steps: an agent's call journaled as its intent before it is forwarded and its outcome after.

Rule of the house: no outside I/O inside a transaction. A call is journaled in two short transactions, the
intent before it is forwarded and the outcome after it returns; the tool server is called in between with
no transaction open. Each transaction holds the run's row lock while it appends to the chain.
"""

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from .. import ports
from ..models import Agent, Run, Step, ToolServer
from ..record import canonical, journaling, sql
from ..record.canonical import to_ijson
from ..record.journaling import Outcome
from ..telemetry import tracing
from ..undo import dependencies, recovery
from . import one_statement
from .links import link
from .record import append_entry, locked_run, locked_run_by_id, open_run, public_id_of, save_moving
from .retry_guard import unknown_attempt
from .runs import IDLE_KEY, release, release_agent

logger = logging.getLogger(__name__)


# A resource read, journaled as a step: it reads and changes nothing, whatever the server says.
READ = {"name": "resources/read", "annotations": {"readOnlyHint": True}}


@dataclass(frozen=True)
class OpenedStep:
    """What `close_step` needs from `open_step`, carried in memory so closing costs no extra read."""

    step_id: int
    run_id: int
    number: int
    server: ToolServer | None = None
    tool: str = ""
    arguments: dict[str, Any] | None = None
    request_meta: dict[str, Any] | None = None
    kind: str = "unknown"  # the tool-level declaration, which a failed call keeps
    source: str = "none"
    policy: dict[str, Any] | None = None  # what the autonomy policy decided (see `open_step`'s `decide`)
    declared: dict[str, Any] | None = None  # the definition the call was read by, when not a tool's (a read)
    traits: recovery.Tool = recovery.Tool()  # what the advice after a failure needs to know of the tool
    earlier: dict[str, Any] | None = None  # what an admin's recipe read just before the call
    run_public: str = ""  # the run's public id, as people know it (pages, logs, traces)


def _find_run(*, agent: Agent, key: str, now: datetime) -> Run:
    """The agent's run for this key, locked. Without a key, the agent's latest keyless run unless it has
    been idle longer than RECORDER_RUN_IDLE_SECONDS or an on-call user ended it (`end_run`). Inside a journal
    group (`sql.one_moment`), the run an earlier job of the group found for this agent and key: the group
    holds its lock, it was active a moment ago, and nobody can have ended it since."""
    if (found := sql.recalled(("agent run", agent.pk, key))) is not None:
        return locked_run_by_id(found)
    run = _look_up_run(agent=agent, key=key, now=now)
    sql.remember(("agent run", agent.pk, key), run.pk)
    return run


def _look_up_run(*, agent: Agent, key: str, now: datetime) -> Run:
    if key and not key.startswith(IDLE_KEY):
        run = locked_run('agent_id = %s AND "key" = %s', [agent.pk, key])
        if run is None:
            try:
                with transaction.atomic():
                    created = open_run(agent=agent, key=key, now=now)
            except IntegrityError:  # another Recorder process created it a moment ago
                created = Run.objects.get(agent=agent, key=key)
            run = locked_run_by_id(created.pk)
        return run
    idle = sql.prep(Run, "last_activity_at", now - timedelta(seconds=settings.RECORDER_RUN_IDLE_SECONDS))
    run = locked_run(
        'agent_id = %s AND "key" = %s AND last_activity_at >= %s AND ended_at IS NULL '
        "ORDER BY last_activity_at DESC LIMIT 1",
        [agent.pk, key, idle],
    )
    if run is None:
        created = open_run(agent=agent, key=key, now=now)
        run = locked_run_by_id(created.pk)
    return run


def open_step(
    *, agent: Agent, run_key: str, server: ToolServer | None, server_name: str, tool: str,
    arguments: dict[str, Any], request_meta: dict[str, Any] | None, now: datetime, decide=None,
    declared: dict[str, Any] | None = None, earlier: dict[str, Any] | None = None, client: str = "",
) -> OpenedStep:
    """Journal the intent of an agent's call, before it is forwarded.

    `decide(declaration, retry_of)`, when given, is the autonomy policy: it returns the decision as a dict
    (`{"decision": "allow"|"ask"|"deny", ...}`), which is kept with the step and in its `call` entry.
    `retry_of` is the latest earlier attempt of the same call by the same agent when its outcome is unknown
    and the tool is neither read-only nor idempotent (`unknown_attempt`), else None. An
    `ask` opens the step as `held`; the caller then releases it (`release_held_step`) or refuses it
    (`refuse_step`), as it does a `deny`. `declared` stands for the tool's definition when the call is not a
    tool's (a resource read: `READ`). `earlier` is what an admin's recipe read of the record just before
    the call (`recipes.earlier_state`): kept with the step, and on the chain right after the call. `client`
    is the client program the call came from, as it names itself (the `call` entry's `client`)."""
    call = dict(server=server, server_name=server_name, tool=tool, arguments=arguments,
                request_meta=request_meta, now=now, decide=decide, declared=declared, agent=agent,
                earlier=earlier, who={"agent": agent.name, "onBehalfOf": agent.on_behalf_of.get_username(),
                                      **({"client": client} if client else {})})
    if earlier is None and server is not None and one_statement.available():
        # One statement, unless a check of the usual way applies.
        opened = _open(None, **call, at_once=run_key)
        if opened is not None:
            return opened
    return _open(lambda: _find_run(agent=agent, key=run_key, now=now), **call)


def open_step_in_run(
    *,
    run_id: int,
    server: ToolServer,
    tool: str,
    arguments: dict[str, Any],
    request_meta: dict[str, Any] | None,
    now: datetime,
    who: dict[str, Any],
) -> OpenedStep:
    """Journal the intent of a call that is not an agent's (a compensation the executor makes) in a run
    that is already known, exactly as an agent's call is journaled: `close_step` records what came back."""
    return _open(lambda: locked_run_by_id(run_id), server=server, server_name=server.name, tool=tool,
                 arguments=arguments, request_meta=request_meta, now=now, who=who)


def _open(find_run, *, server: ToolServer | None, server_name: str, tool: str, arguments: dict[str, Any],
          request_meta: dict[str, Any] | None, now: datetime, who: dict[str, Any], decide=None,
          declared: dict[str, Any] | None = None, agent: Agent | None = None,
          earlier: dict[str, Any] | None = None, at_once: str | None = None) -> OpenedStep | None:
    """Journal the intent (see `open_step`): the policy decides first, outside the transaction; then, with
    the run's row locked, the step row and the chain's `call` entry. With `at_once` (the agent's run key),
    as one statement (`one_statement`), the policy asked as if no earlier attempt's outcome were unknown;
    None when a check of the usual way applies (nothing was written)."""
    call = journaling.prepared(
        arguments=arguments,
        request_meta=request_meta,
        tool_def=declared or (server.tool(tool) if server else None),
        catalogue=server.tool_names if server else set(),
        recipe=server.recipe(tool) if server and not declared else None,
        listing=server.catalogue if server else [],
        earlier=earlier,
        agent=who.get("agent"),
        server_name=server_name,
        tool=tool,
    )
    traits, decision = call.traits, None
    if decide is not None:
        with tracing.TRACER.start_as_current_span("policy decision") as span:
            # At once, the statement holds only if no earlier attempt's outcome is unknown.
            guarded = call.guarded and at_once is None
            decision = to_ijson(decide(call.declaration,
                                       retry_of=unknown_attempt(call.digest) if guarded else None))
            if span.is_recording():
                span.set_attributes(_decision_attributes(decision))
        if decision and decision.get("allowUnknownRetries"):
            traits = dataclasses.replace(traits, retries_allowed=True)
    status = journaling.opening_status(decision)
    # The `call` entry's payload written before the lock, but for what the lock decides.
    entry = canonical.members(to_ijson(journaling.call_entry_asked(
        server_name=server_name, tool=tool, call=call, who=who)))
    if at_once is not None:
        done = one_statement.open_agent_call(agent=agent, run_key=at_once, server=server, tool=tool,
                                             call=call, decision=decision, entry=entry, now=now)
        return None if done is None else OpenedStep(
            step_id=done[0], run_id=done[1], number=done[2], server=server, tool=tool,
            arguments=call.arguments, request_meta=call.request_meta, kind=call.declaration.kind,
            source=call.declaration.source, policy=decision, declared=declared, traits=traits,
            run_public=done[3])
    with transaction.atomic():
        run = find_run()
        if decide is not None and (halt := _halt(run, agent, now=now)) is not None:
            decision = journaling.halted_decision(decision, why=halt[1], plan=halt[0])
            status = Step.Status.PENDING
        number = run.step_count + 1
        step_id = sql.insert(Step, {
            "run_id": run.pk, "number": number,
            "earlier_state": to_ijson(earlier) if earlier is not None else None,
            **journaling.step_columns(call, server=server, server_name=server_name, tool=tool, now=now,
                                      status=status, decision=decision)})
        run.step_count = number
        entry |= canonical.members(to_ijson(journaling.call_entry_decided(number=number, decision=decision)))
        append_entry(run=run, event="call", now=now, written=canonical.joined(entry))
        if earlier is not None:  # the Recorder's own read, before the call was sent: on the record too,
            # what it read included (bounded like an inline result), so it is exported with the run
            append_entry(run=run, event="earlier_state", now=now, data={"step": number, **to_ijson(earlier)})
        save_moving(run, now=now)
    return OpenedStep(step_id=step_id, run_id=run.pk, number=number, server=server, tool=tool,
                      arguments=call.arguments, request_meta=call.request_meta, kind=call.declaration.kind,
                      source=call.declaration.source, policy=decision, declared=declared, traits=traits,
                      earlier=earlier, run_public=public_id_of(run.pk))


def _decision_attributes(decision: dict[str, Any] | None) -> dict[str, str]:
    """A policy decision as span attributes: what it decided, by which policy, for which class of call."""
    decision = decision or {}
    policy = decision.get("policy") if isinstance(decision.get("policy"), dict) else {}
    return {"undo.policy.decision": str(decision.get("decision", "allow")),
            "undo.policy.name": str(policy.get("name", "")),
            "undo.policy.class": str(decision.get("class", ""))}


def _halt(run: Run, agent: Agent | None, *, now: datetime) -> tuple[str, str] | None:
    """(plan, why) when an agent's call must be refused because a failure stopped this run, or stopped the
    agent in another run (a saga policy), and the plan undoing it is still open; a halt whose plan has ended
    is released here, on the record. The caller holds the run's row lock. The agent's halt is read here, by
    its key (the agent the request carries may be seconds old). `one_statement._open_sql` reads the same two
    halts in SQL and, finding either, leaves the call to this function."""
    halted = sql.first_row(Agent, ("halted_by_plan", "halted_reason"), "id = %s", [agent.pk]) \
        if agent is not None else None
    agent_plan, agent_reason = halted or ("", "")
    plan = run.halted_by_plan or agent_plan
    if not plan:
        return None
    why = ports.gate().halting(plan=plan)
    if why and plan != run.halted_by_plan:
        why = (f"This agent is halted: {agent_reason} Its calls in every run are refused until that plan "
               "ends or a person releases the halted run from its page.")
    if why:
        return plan, why
    if plan == run.halted_by_plan:
        release(run, by="the Recorder", why="the plan that halted it has ended", now=now)
    else:
        release_agent(agent_id=agent.pk, plan=plan)
    return None


def release_held_step(*, opened: OpenedStep, approval: dict[str, Any], now: datetime) -> bool:
    """A held call was approved: it may now be forwarded (the step is in flight, like any other call).
    False, with nothing written, when the step is no longer held: the record already says this attempt was
    never sent (the agent stopped waiting, or was told to call again, or its Recorder stopped), so it never
    is. The approval side claims an approval and releases its step in one transaction
    (`approver.services.held_calls.claim_approved_action`)."""
    with transaction.atomic():
        run = locked_run_by_id(opened.run_id)
        if not sql.update(
            Step, opened.step_id, {"status": Step.Status.PENDING}, only_if={"status": Step.Status.HELD}
        ):
            return False
        append_entry(run=run, event="released", now=now, data={"step": opened.number, **to_ijson(approval)})
        save_moving(run, now=None)
    return True


def held_step_alive(*, step_id: int, now: datetime, held_call: str = "", task: bool = False) -> bool:
    """The process holding this call still waits on it (`ports.HOLD_BEAT_SECONDS`), on the held call
    `held_call` when it says which, and for the agent as a task when `task`; False once it is not held."""
    values = {"held_seen_at": now, **({"held_call": held_call[:36]} if held_call else {}),
              **({"held_task": True} if task else {})}
    return bool(sql.update(Step, step_id, values, only_if={"status": Step.Status.HELD}))


def adopt_held_task(*, step_id: int, seen: datetime | None, now: datetime) -> bool:
    """Take over waiting on a held call the agent has as a task, whose process stopped marking it (last
    marked at `seen`): True for exactly one of the processes that try (a conditional update)."""
    return bool(Step.objects.filter(pk=step_id, status=Step.Status.HELD, held_task=True, held_seen_at=seen)
                .update(held_seen_at=now))


def refuse_step(
    *, opened: OpenedStep, message: str, now: datetime, advice: dict[str, Any] | None = None,
    held_end: str = "",
) -> bool:
    """A call the autonomy policy stopped (denied, or held and not sent): nothing was forwarded, and the
    record says why (and what the agent was advised to do, `advice`; how a held attempt ended, `held_end`, one
    of `ports.HeldEnd`). Only a step still held or not yet forwarded is closed (a conditional update): a step
    an approval released is in flight, and this returns False."""
    fields = {"status": Step.Status.ERROR, "is_error": True, "error_message": message,
              "failure_class": Step.FailureClass.POLICY, "finished_at": now}
    if advice is not None:
        fields["recovery"] = to_ijson(advice)
    if held_end:
        fields["held_end"] = held_end
    with transaction.atomic():
        run = locked_run_by_id(opened.run_id)
        step = Step.objects.filter(pk=opened.step_id).values_list("status", flat=True).first()
        if step not in (Step.Status.HELD, Step.Status.PENDING):
            return False
        if not sql.update(Step, opened.step_id, fields, only_if={"status": step}):
            return False
        run.failed_count += 1
        run.state = Run.State.FAILED
        append_entry(run=run, event="result", now=now, data={
            "step": opened.number, "status": Step.Status.ERROR, "isError": True, "result": None,
            "error": message, "failureClass": Step.FailureClass.POLICY, "forwarded": False,
            **({"recovery": fields["recovery"]} if advice is not None else {}),
            **({"held": held_end} if held_end else {}),
        })
        save_moving(run, now=now)
    return True


@dataclass(frozen=True)
class Closing:
    """What `close_step` writes, worked out before its transaction: the step's fields, the `result` entry's
    data with every member written in JCS but `dependsOn` (which reads the run), and the values the step's
    links are looked up by and its result is indexed under. Pure, so the Recorder works it out on its event
    loop while the journal thread writes other calls (`prepare_close`)."""

    step: Step  # the closed step as far as its fields say, not saved (close_step sets its result_seq)
    fields: dict[str, Any]
    has_result: bool
    acted: bool
    entry: dict[str, bytes]
    wanted: Any  # dependencies.distinctive_values of the arguments
    indexed: dict[str, str]


def prepare_close(*, opened: OpenedStep, outcome: Outcome, started: datetime, finished: datetime) -> Closing:
    """The pure part of closing a step (`Closing`); what each outcome means is `journaling.closed_fields`."""
    server = opened.server
    step = Step(pk=opened.step_id, run_id=opened.run_id, number=opened.number, server=server,
                server_name=server.name if server else "", tool=opened.tool,
                arguments=opened.arguments or {}, request_meta=opened.request_meta)
    tool = journaling.Tool(definition=opened.declared or (server.tool(step.tool) if server else None),
                           catalogue=frozenset(server.tool_names) if server else frozenset(),
                           receipt_keys=server.receipt_keys if server else {},
                           recipe=server.recipe(step.tool) if server and not opened.declared else None,
                           listing=server.catalogue if server else [], earlier=opened.earlier)
    fields, result = journaling.closed_fields(
        outcome=outcome,
        tool=tool,
        arguments=step.arguments,
        started=started,
        finished=finished,
        inline_limit=settings.RECORDER_INLINE_RESULT_BYTES,
    )
    for name, value in fields.items():
        setattr(step, name, value)
    step.reversibility = fields.get("reversibility", opened.kind)
    step.declaration_source = fields.get("declaration_source", opened.source)
    step.undo_problems = fields.get("undo_problems", [])
    entry = to_ijson(journaling.result_entry(step, result=result, outcome=outcome,
                                             recovery=fields.get("recovery"), links=None))
    structured = step.result.get("structuredContent") if isinstance(step.result, dict) else None
    indexed = {}
    if step.status == Step.Status.OK and structured is not None:
        # Only structured results are indexed: free text ("echo", "Files staged") would link everything.
        indexed = dependencies.first_pointers(
            dependencies.distinctive_values(structured, "/structuredContent"))
    return Closing(step=step, fields=fields, has_result=result is not None,
                   acted=journaling.acted(outcome, is_error=step.is_error), entry=canonical.members(entry),
                   wanted=dependencies.distinctive_values(step.arguments), indexed=indexed)


def close_step(*, opened: OpenedStep, outcome: Outcome, started: datetime, finished: datetime,
               closing: Closing | None = None) -> Step | None:
    """Journal what came back, with the undo facts, dependencies and counters, in one transaction. What
    needs no lock is worked out first (`prepare_close`; the Recorder passes it in as `closing`, worked out
    off the journal thread): under the run's lock, only the step's links, its row, the entry's own members
    and the run's counters.

    Only a `pending` step is closed (a conditional update): if the reconciler already closed it as
    unrecorded, a late answer changes nothing and None is returned."""
    closing = closing or prepare_close(opened=opened, outcome=outcome, started=started, finished=finished)
    if one_statement.available():  # as one statement, unless a check of the usual way applies
        closed = one_statement.close_call(run_id=opened.run_id, closing=closing, finished=finished)
        if closed is not False:
            return closed if closed is not None else _closed_already(opened)
    # `closing` is used again if its group is rolled back and the job replayed: its fields are copied, and the
    # one attribute of its step set here (`result_seq`) is set again on a replay, before anything reads it.
    step, fields = closing.step, dict(closing.fields)
    with transaction.atomic():
        run = locked_run_by_id(opened.run_id)
        if closing.has_result:
            fields["result_seq"] = step.result_seq = run.head_seq + 1  # the `result` entry below is the next
        if not sql.update(Step, step.pk, fields, only_if={"status": Step.Status.PENDING}):
            return _closed_already(opened)
        count(run, step, acted=closing.acted)
        links = link(run, step, wanted=closing.wanted, indexed=closing.indexed)
        written = canonical.joined({**closing.entry, "dependsOn": canonical.canonical_bytes(to_ijson(links))})
        append_entry(run=run, event="result", now=finished, written=written)
        save_moving(run, now=finished)
    return step


def _closed_already(opened: OpenedStep) -> None:
    logger.warning("step %s of run %s was already closed; this late outcome is not recorded", opened.number,
                   opened.run_id)


def mark_undelivered(*, opened: OpenedStep, message: str, now: datetime) -> bool:
    """A call closed as answered whose answer never reached the agent (it went away first): the step says
    so, with the server's answer kept (it acted). Only a step closed as `ok` or `error` changes."""
    with transaction.atomic():
        run = locked_run_by_id(opened.run_id)
        status = Step.objects.filter(pk=opened.step_id).values_list("status", flat=True).first()
        if status not in (Step.Status.OK, Step.Status.ERROR) or not sql.update(
                Step, opened.step_id, {"status": Step.Status.UNDELIVERED, "error_message": message,
                                       "may_have_acted": True},
                only_if={"status": status}):
            return False
        if status == Step.Status.OK:
            run.failed_count += 1
        run.state = Run.State.FAILED
        append_entry(run=run, event="undelivered", now=now, data={"step": opened.number, "error": message})
        save_moving(run, now=now)
    return True


def count(run: Run, step: Step, *, acted: bool) -> None:
    """Keep the run list's counters (`journaling.counters`): a failed call counts as failed and fails the
    run; only calls that acted (or may have) count towards reversible, irreversible or unknown."""
    failed, counter = journaling.counters(status=step.status, reversibility=step.reversibility, acted=acted)
    if failed:
        run.failed_count += 1
        run.state = Run.State.FAILED
    if counter is not None:
        setattr(run, counter, getattr(run, counter) + 1)
