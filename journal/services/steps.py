"""Runs and steps: an agent's call journaled as its intent before it is forwarded and its outcome after.

Rule of the house: no outside I/O inside a transaction. A call is journaled in two short transactions, the
intent before it is forwarded and the outcome after it returns; the tool server is called in between with
no transaction open. Each transaction holds the run's row lock while it appends to the chain.
"""

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import chain, declarations, dependencies, outcomes, ports, recovery, sql
from ..canonical import sha256_hex, to_ijson
from ..models import Agent, Run, RunValue, Step, StepDependency, ToolServer
from .record import append_entry, locked_run, open_run, save_moving
from .runs import release

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


# The run columns a call reads and moves. They are integers and text, so the hot path reads them raw


def _find_run(*, agent: Agent, key: str, now: datetime) -> Run:
    """The agent's run for this key, locked. Without a key, the agent's latest keyless run unless it has
    been idle longer than RECORDER_RUN_IDLE_SECONDS or an on-call user ended it (`end_run`)."""
    if key:
        run = locked_run('agent_id = %s AND "key" = %s', [agent.pk, key])
        if run is None:
            try:
                with transaction.atomic():
                    created = open_run(agent=agent, key=key, now=now)
            except IntegrityError:  # another Recorder process created it a moment ago
                created = Run.objects.get(agent=agent, key=key)
            run = locked_run("id = %s", [created.pk])
        return run
    idle = sql.prep(Run, "last_activity_at", now - timedelta(seconds=settings.RECORDER_RUN_IDLE_SECONDS))
    run = locked_run(
        'agent_id = %s AND "key" = %s AND last_activity_at >= %s AND ended_at IS NULL '
        "ORDER BY last_activity_at DESC LIMIT 1",
        [agent.pk, "", idle],
    )
    if run is None:
        created = open_run(agent=agent, key="", now=now)
        run = locked_run("id = %s", [created.pk])
    return run


def open_step(
    *, agent: Agent, run_key: str, server: ToolServer | None, server_name: str, tool: str,
    arguments: dict[str, Any], request_meta: dict[str, Any] | None, now: datetime, decide=None,
    declared: dict[str, Any] | None = None,
) -> OpenedStep:
    """Journal the intent of an agent's call, before it is forwarded.

    `decide(declaration, retry_of)`, when given, is the autonomy policy: it returns the decision as a dict
    (`{"decision": "allow"|"ask"|"deny", ...}`), which is kept with the step and in its `call` entry.
    `retry_of` is the latest earlier attempt of the same call by the same agent when its outcome is unknown
    and the tool is neither read-only nor idempotent (`unknown_attempt`), else None. An
    `ask` opens the step as `held`; the caller then releases it (`release_held_step`) or refuses it
    (`refuse_step`), as it does a `deny`. `declared` stands for the tool's definition when the call is not a
    tool's (a resource read: `READ`)."""
    return _open(lambda: _find_run(agent=agent, key=run_key, now=now), server=server, server_name=server_name,
                 tool=tool, arguments=arguments, request_meta=request_meta, now=now,
                 who={"agent": agent.name, "onBehalfOf": agent.on_behalf_of.get_username()}, decide=decide,
                 declared=declared)


def open_step_in_run(
    *, run_id: int, server: ToolServer, tool: str, arguments: dict[str, Any], request_meta: dict[str, Any] | None,
    now: datetime, who: dict[str, Any],
) -> OpenedStep:
    """Journal the intent of a call that is not an agent's (a compensation the executor makes) in a run
    that is already known, exactly as an agent's call is journaled: `close_step` records what came back."""
    return _open(lambda: locked_run("id = %s", [run_id]), server=server, server_name=server.name, tool=tool,
                 arguments=arguments, request_meta=request_meta, now=now, who=who)


def _open(find_run, *, server: ToolServer | None, server_name: str, tool: str, arguments: dict[str, Any],
          request_meta: dict[str, Any] | None, now: datetime, who: dict[str, Any], decide=None,
          declared: dict[str, Any] | None = None) -> OpenedStep:
    arguments = to_ijson(arguments)
    request_meta = to_ijson(request_meta) if request_meta else None
    tool_def = declared or (server.tool(tool) if server else None)
    declaration = declarations.normalise(tool_def or {}, catalogue=server.tool_names if server else set())
    traits = recovery.tool_of(tool_def, kind=declaration.kind)
    digest = sha256_hex({"agent": who.get("agent"), "server": server_name, "tool": tool, "arguments": arguments})
    decision = None
    if decide is not None:
        guarded = recovery.needs_retry_guard(kind=declaration.kind, idempotent=traits.idempotent)
        decision = to_ijson(decide(declaration, retry_of=unknown_attempt(digest) if guarded else None))
        if decision and decision.get("allowUnknownRetries"):
            traits = dataclasses.replace(traits, retries_allowed=True)
    status = Step.Status.HELD if decision and decision.get("decision") == "ask" else Step.Status.PENDING
    with transaction.atomic():
        run = find_run()
        if run.halted_by_plan and decide is not None:  # an agent's call into a run a failure stopped
            halted = ports.gate().halting(plan=run.halted_by_plan)
            if halted:
                decision = {"decision": "deny", "class": (decision or {}).get("class", "unknown"), "reason": halted,
                            "haltedBy": run.halted_by_plan}
                status = Step.Status.PENDING
            else:
                release(run, by="the Recorder", why="the plan that halted it has ended", now=now)
        number = run.step_count + 1
        step_id = sql.insert(Step, dict(
            run_id=run.pk, number=number, server_id=server.pk if server else None, server_name=server_name,
            tool=tool, arguments=arguments, request_meta=request_meta, started_at=now,
            declaration=declaration.model_dump(mode="json"), declaration_source=declaration.source,
            reversibility=declaration.kind, status=status, policy_decision=decision, call_digest=digest,
        ))
        run.step_count = number
        entry = {"step": number, "server": server_name, "tool": tool, "arguments": arguments, **who}
        if request_meta:
            entry["meta"] = request_meta  # what goes out with the arguments, so the record covers it too
        if decision is not None:
            entry["policy"] = decision
        append_entry(run=run, event="call", now=now, data=entry)
        save_moving(run, now=now)
    return OpenedStep(step_id=step_id, run_id=run.pk, number=number, server=server, tool=tool, arguments=arguments,
                      request_meta=request_meta, kind=declaration.kind, source=declaration.source, policy=decision,
                      declared=declared, traits=traits)


# What became of an earlier attempt, in the words of a held repeat's reason.
_UNKNOWN_WORDS = {Step.Status.ERROR: "no answer came back", Step.Status.CANCELLED: "cancelled while the server had it",
                  Step.Status.UNDELIVERED: "the server answered, but the agent never got the answer"}


def unknown_attempt(digest: str) -> dict[str, Any] | None:
    """The latest earlier attempt of the same call (agent, server, tool, arguments) that reached the server,
    if its outcome is unknown to the agent: what the retry guard holds a repeat for. An attempt that never
    went out (stopped by a policy, or cancelled before it was sent) does not count, so a denied or expired
    repeat does not hide the attempt that may have acted. One indexed read."""
    row = sql.first_row(
        Step, ("number", "run_id", "status", "may_have_acted"),
        "call_digest = %s AND status IN (%s, %s, %s, %s) AND failure_class <> %s "
        "AND NOT (status = %s AND may_have_acted = %s) ORDER BY id DESC LIMIT 1",
        [digest, Step.Status.OK, Step.Status.ERROR, Step.Status.UNDELIVERED, Step.Status.CANCELLED,
         Step.FailureClass.POLICY, Step.Status.CANCELLED, sql.prep(Step, "may_have_acted", False)])
    if row is None:
        return None
    number, run_id, status, may_have_acted = row
    if not may_have_acted:
        return None
    public_id = Run.objects.filter(pk=run_id).values_list("public_id", flat=True).first()
    return {"step": number, "run": str(public_id), "status": status, "what": _UNKNOWN_WORDS.get(status, status)}


def release_held_step(*, opened: OpenedStep, approval: dict[str, Any], now: datetime) -> bool:
    """A held call was approved: it may now be forwarded (the step is in flight, like any other call)."""
    with transaction.atomic():
        run = locked_run("id = %s", [opened.run_id])
        if not sql.update(Step, opened.step_id, {"status": Step.Status.PENDING}, only_if={"status": Step.Status.HELD}):
            return False
        append_entry(run=run, event="released", now=now, data={"step": opened.number, **to_ijson(approval)})
        save_moving(run, now=None)
    return True


def refuse_step(*, opened: OpenedStep, message: str, now: datetime, advice: dict[str, Any] | None = None) -> bool:
    """A call the autonomy policy stopped (denied, or held and not approved in time): nothing was forwarded,
    and the record says why (and what the agent was advised to do, `advice`). Only a step still held or not
    yet forwarded is closed."""
    fields = {"status": Step.Status.ERROR, "is_error": True, "error_message": message,
              "failure_class": Step.FailureClass.POLICY, "finished_at": now}
    if advice is not None:
        fields["recovery"] = to_ijson(advice)
    with transaction.atomic():
        run = locked_run("id = %s", [opened.run_id])
        step = Step.objects.filter(pk=opened.step_id).values_list("status", flat=True).first()
        if step not in (Step.Status.HELD, Step.Status.PENDING):
            return False
        sql.update(Step, opened.step_id, fields, only_if={"status": step})
        run.failed_count += 1
        run.state = Run.State.FAILED
        append_entry(run=run, event="result", now=now, data={
            "step": opened.number, "status": Step.Status.ERROR, "isError": True, "result": None,
            "error": message, "failureClass": Step.FailureClass.POLICY, "forwarded": False,
            **({"recovery": fields["recovery"]} if advice is not None else {}),
        })
        save_moving(run, now=now)
    return True


@dataclass(frozen=True)
class Outcome:
    """What came back for a call: a raw result (which may be an `isError` result), or a failure.
    `undelivered` says why a result the server sent never reached the agent (the server acted all the same)."""

    result: dict[str, Any] | None = None
    error_message: str = ""
    failure_class: str = ""
    may_have_acted: bool = False
    undelivered: str = ""
    cancelled: str = ""  # why the agent never waited for the answer (with may_have_acted once the server had it)
    oversized: Any = None  # a `journal.mcp.bounded.Oversized`: the server answered over the limit; nothing kept
    recovery: dict[str, Any] | None = None  # what the agent was advised to do about a failure (journal.recovery)


def measured(result: dict[str, Any]) -> tuple[int, str]:
    """The size and SHA-256 of a result as compact JSON."""
    body = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
    return len(body), hashlib.sha256(body).hexdigest()


def close_step(*, opened: OpenedStep, outcome: Outcome, started: datetime, finished: datetime) -> Step | None:
    """Journal what came back, with the undo facts, dependencies and counters, in one transaction.

    Only a `pending` step is closed (a conditional update): if the reconciler already closed it as
    unrecorded, a late answer changes nothing and None is returned."""
    step = Step(pk=opened.step_id, run_id=opened.run_id, number=opened.number, server=opened.server,
                server_name=opened.server.name if opened.server else "", tool=opened.tool,
                arguments=opened.arguments or {}, request_meta=opened.request_meta)
    fields: dict[str, Any] = {"finished_at": finished, "duration_ms": (finished - started).total_seconds() * 1000}
    result = None
    if outcome.result is not None:
        result = to_ijson(outcome.result)
        is_error = result.get("isError") is True
        size, digest = measured(result)
        inline = size <= settings.RECORDER_INLINE_RESULT_BYTES
        fields.update(result=result if inline else None, result_size=size, result_sha256=digest,
                      result_storage=Step.ResultStorage.INLINE if inline else Step.ResultStorage.JOURNAL,
                      is_error=is_error, status=Step.Status.ERROR if is_error else Step.Status.OK)
        if is_error:
            fields["failure_class"] = outcomes.classify_tool_error(result)
        else:
            server = step.server
            fields.update(outcomes.undo_facts(
                tool_def=opened.declared or (server.tool(step.tool) if server else None), catalogue=server.tool_names if server else set(),
                receipt_keys=server.receipt_keys if server else {}, arguments=step.arguments, result=result,
                finished=finished))
        if result.get("resultType") == "input_required":  # 2026-07-28: asked for more before doing anything
            fields.update(reversibility=Step.Reversibility.READ_ONLY, undo_problems=[], compensation_arguments=None,
                          effect_summary="The server asked for more input before acting.")
        if outcome.undelivered:
            fields.update(status=Step.Status.UNDELIVERED, error_message=outcome.undelivered, may_have_acted=True)
    elif outcome.oversized is not None:
        fields.update(status=Step.Status.UNDELIVERED, error_message=outcome.undelivered, may_have_acted=True,
                      result_size=outcome.oversized.size, result_sha256=outcome.oversized.sha256,
                      result_storage=Step.ResultStorage.DROPPED, reversibility=Step.Reversibility.UNKNOWN,
                      undo_problems=["the server answered over the Recorder's size limit and its answer was not "
                                     "kept, so what it did is unknown"])
    elif outcome.cancelled and outcome.may_have_acted:
        fields.update(status=Step.Status.CANCELLED, error_message=outcome.cancelled, may_have_acted=True,
                      reversibility=Step.Reversibility.UNKNOWN, undo_problems=[
                          "the agent cancelled the call while the server had it, so it may or may not have acted"])
    elif outcome.cancelled:  # before anything was sent: nothing happened, so there is nothing to undo
        fields.update(status=Step.Status.CANCELLED, error_message=outcome.cancelled,
                      reversibility=Step.Reversibility.READ_ONLY, undo_problems=[])
    else:
        fields.update(status=Step.Status.ERROR, is_error=True, error_message=outcome.error_message,
                      failure_class=outcome.failure_class or Step.FailureClass.UNKNOWN)
        if outcome.may_have_acted:
            fields.update(may_have_acted=True, reversibility=Step.Reversibility.UNKNOWN, undo_problems=[
                "the server did not answer, so it may or may not have acted"])

    if outcome.recovery is not None:
        fields["recovery"] = to_ijson(outcome.recovery)

    with transaction.atomic():
        run = locked_run("id = %s", [opened.run_id])
        if result is not None:
            fields["result_seq"] = run.head_seq + 1  # the `result` entry below is the run's next
        if not sql.update(Step, step.pk, fields, only_if={"status": Step.Status.PENDING}):
            logger.warning("step %s of run %s was already closed; this late outcome is not recorded",
                           opened.number, opened.run_id)
            return None
        for name, value in fields.items():
            setattr(step, name, value)
        step.reversibility = fields.get("reversibility", opened.kind)
        step.declaration_source = fields.get("declaration_source", opened.source)
        step.undo_problems = fields.get("undo_problems", [])
        count(run, step, acted=(outcome.result is not None and not step.is_error) or outcome.may_have_acted
              or outcome.oversized is not None)
        links = _link(run, step)
        append_entry(run=run, event="result", now=finished, data={
            "step": step.number,
            "status": step.status,
            "isError": step.is_error,
            "result": result,
            **({"resultSize": step.result_size, "resultSha256": step.result_sha256} if step.result_size is not None
               else {}),
            **({"resultDropped": True} if outcome.oversized is not None else {}),
            "error": step.error_message or None,
            "failureClass": step.failure_class or None,
            **({"recovery": fields["recovery"]} if "recovery" in fields else {}),
            "durationMs": round(step.duration_ms or 0, 3),
            "undo": {
                "kind": step.reversibility, "source": step.declaration_source,
                "compensationArguments": step.compensation_arguments, "problems": step.undo_problems,
                "undoBy": chain.format_ts(step.undo_by) if step.undo_by else None,
            },
            "effect": {"summary": step.effect_summary, "resource": step.effect_resource,
                       "version": step.effect_version} if step.effect_summary or step.effect_version else None,
            "receiptVerified": step.receipt_verified,
            "dependsOn": links,
        })
        save_moving(run, now=finished)
    return step


def mark_undelivered(*, opened: OpenedStep, message: str, now: datetime) -> bool:
    """A call closed as answered whose answer never reached the agent (it went away first): the step says
    so, with the server's answer kept (it acted). Only a step closed as `ok` or `error` changes."""
    with transaction.atomic():
        run = locked_run("id = %s", [opened.run_id])
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
    """Keep the run list's counters. A failed call counts as failed; only calls that acted (or may have,
    when the server never answered) count towards reversible, irreversible or unknown."""
    if step.status in (Step.Status.ERROR, Step.Status.UNDELIVERED):  # the agent saw a failure either way
        run.failed_count += 1
        run.state = Run.State.FAILED
    if not acted:
        return
    if step.reversibility == Step.Reversibility.COMPENSATE:
        run.reversible_count += 1
    elif step.reversibility == Step.Reversibility.NONE:
        run.irreversible_count += 1
    elif step.reversibility == Step.Reversibility.UNKNOWN:
        run.unknown_count += 1


def _link(run: Run, step: Step) -> list[dict[str, Any]]:
    """Record inferred and declared dependencies of `step`, and index its result for later steps."""
    links: list[dict[str, Any]] = []
    wanted = dependencies.distinctive_values(step.arguments)
    if wanted:
        digests = sorted({d for d, _ in wanted})
        known = {value_digest: (step_id, pointer, seen) for value_digest, step_id, pointer, seen in sql.all_rows(
            RunValue, ("digest", "step_id", "pointer", "seen"),
            f"run_id = %s AND step_id <> %s AND digest IN ({sql.marks(len(digests))})", [run.pk, step.pk, *digests])}
        found = dependencies.choose_links(wanted, known)
        if found:
            numbers = dict(sql.all_rows(Step, ("id", "number"), f"id IN ({sql.marks(len(found))})", list(found)))
            StepDependency.objects.bulk_create([
                StepDependency(step=step, depends_on_id=step_id, rule=StepDependency.Rule.INFERRED, pointers=pointers)
                for step_id, pointers in found.items()
            ])
            links += [{"step": numbers[s], "rule": "inferred", "pointers": p} for s, p in sorted(found.items())]

    declared = ((step.request_meta or {}).get(declarations.HATP_KEY) or {}).get("dependsOn")
    if isinstance(declared, list):
        wanted_numbers = {n for n in declared if isinstance(n, int) and not isinstance(n, bool) and 0 < n < step.number}
        targets = dict(Step.objects.filter(run=run, number__in=wanted_numbers).values_list("number", "pk"))
        StepDependency.objects.bulk_create([
            StepDependency(step=step, depends_on_id=pk, rule=StepDependency.Rule.DECLARED) for pk in targets.values()
        ])
        links += [{"step": number, "rule": "declared"} for number in sorted(targets)]

    structured = step.result.get("structuredContent") if isinstance(step.result, dict) else None
    if step.status == Step.Status.OK and structured is not None:
        # Only structured results are indexed: free text ("echo", "Files staged") would link everything.
        _index(run, step, dependencies.first_pointers(
            dependencies.distinctive_values(structured, "/structuredContent")))
    return links


def _index(run: Run, step: Step, values: dict[str, str]) -> None:
    """`step` is now the most recent step of the run whose result had each of `values` (digest: pointer)."""
    if not values:
        return
    # One statement however many values: a new value is inserted, a known one moves to this step, seen once more.
    sql.upsert(RunValue, [{"run_id": run.pk, "digest": value_digest, "step_id": step.pk, "pointer": pointer, "seen": 1}
                          for value_digest, pointer in sorted(values.items())],
               unique=("run_id", "digest"), replace=("step_id", "pointer"), increment="seen")


def reconcile_stale_steps(*, older_than: datetime, now: datetime | None = None) -> int:
    """Close steps still `pending` long after any call could have lasted: the Recorder stopped (or its
    database failed) between forwarding a call and recording the answer. The server may have acted, so the
    step becomes a failed call whose outcome is unknown, never a silent gap in the record. A step still
    `held` after the longest hold was never forwarded: it is closed as such."""
    now = now or timezone.now()
    closed = 0
    held_before = older_than - timedelta(seconds=ports.MAX_HOLD_SECONDS)
    local = Step.objects.exclude(run__state=Run.State.IMPORTED)  # an imported run's record is not ours to close
    for step in local.filter(status=Step.Status.HELD, started_at__lt=held_before).iterator():
        opened = OpenedStep(step_id=step.pk, run_id=step.run_id, number=step.number)
        closed += refuse_step(opened=opened, now=now, message=(
            "The Recorder stopped while this call waited for approval; it was never forwarded."))
    stale = local.filter(status=Step.Status.PENDING, started_at__lt=older_than).select_related("server")
    for step in stale.iterator():
        opened = OpenedStep(
            step_id=step.pk, run_id=step.run_id, number=step.number, server=step.server, tool=step.tool,
            arguments=step.arguments, request_meta=step.request_meta, kind=step.reversibility,
            source=step.declaration_source,
        )
        # close_step closes only a step that is still pending, so a real answer recorded a moment ago wins.
        if close_step(opened=opened, started=step.started_at, finished=now, outcome=Outcome(
                error_message="The Recorder stopped before the tool server's answer was recorded.",
                failure_class=Step.FailureClass.UNKNOWN, may_have_acted=True)):
            closed += 1
    return closed

