"""Every write on the Recorder side: agents, tool servers, runs, steps and the chain.

Rule of the house: no outside I/O inside a transaction. A call is journaled in two short transactions, the
intent before it is forwarded and the outcome after it returns; the tool server is called in between with
no transaction open.
"""

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import chain, declarations, dependencies, keys, sql
from .bindings import BindingError, resolve_arguments
from .canonical import to_ijson
from .mcp.client import classify_tool_error
from .models import Agent, ChainEntry, Checkpoint, ResultValue, Run, Step, StepDependency, ToolServer

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "agt_"


# -- agents -----------------------------------------------------------------------------------------------


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_agent(*, name: str, on_behalf_of) -> tuple[Agent, str]:
    """Create an agent and return it with its bearer token, which is shown once and never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    agent = Agent.objects.create(
        name=name, on_behalf_of=on_behalf_of, token_hash=hash_token(token), token_prefix=token[:10]
    )
    return agent, token


def authenticate_agent(token: str) -> Agent | None:
    if not token.startswith(TOKEN_PREFIX):
        return None
    return (
        Agent.objects.select_related("on_behalf_of")
        .filter(token_hash=hash_token(token), is_active=True, on_behalf_of__is_active=True)
        .first()
    )


# -- tool servers -----------------------------------------------------------------------------------------


def register_tool_server(*, name: str, url: str = "", command: str = "") -> ToolServer:
    transport = ToolServer.Transport.STDIO if command else ToolServer.Transport.HTTP
    server = ToolServer(name=name, transport=transport, url=url, command=command)
    server.full_clean()
    server.save()
    return server


def save_catalogue(*, server: ToolServer, tools: list[dict[str, Any]] | None, error: str = "",
                   now: datetime | None = None) -> ToolServer:
    """Keep the raw catalogue and pin receipt keys on first sight; a key id that later changes its key is
    refused (and said so), because a server that swaps keys under the same id could forge old receipts."""
    now = now or timezone.now()
    if tools is None:
        server.catalogue_error = error
        server.save(update_fields=["catalogue_error", "updated_at"])
        return server
    tools = to_ijson(tools)
    problems = []
    pinned = dict(server.receipt_keys)
    for tool in tools:
        if not isinstance(tool, dict):
            problems.append("the catalogue has entries that are not tool objects; agents will not see them")
            continue
        journal = tool["_meta"].get(declarations.HATP_KEY) if isinstance(tool.get("_meta"), dict) else None
        published = journal.get("receiptKeys") if isinstance(journal, dict) else None
        for key in published if isinstance(published, list) else []:
            if not isinstance(key, dict) or key.get("alg") != "Ed25519":
                continue
            key_id, public = str(key.get("keyId", "")), str(key.get("publicKey", ""))
            if not key_id or not public:
                continue
            if key_id in pinned and pinned[key_id] != public:
                problems.append(f"receipt key {key_id} changed; the pinned key is kept")
                continue
            try:
                keys.public_key_from_text(public)
            except ValueError:
                problems.append(f"receipt key {key_id} is not an Ed25519 public key")
                continue
            pinned[key_id] = public
    server.catalogue = tools
    server.catalogue_fetched_at = now
    server.catalogue_error = "; ".join(sorted(set(problems)))
    server.receipt_keys = pinned
    server.save(update_fields=["catalogue", "catalogue_fetched_at", "catalogue_error", "receipt_keys", "updated_at"])
    return server


# -- the chain --------------------------------------------------------------------------------------------


def append_entry(*, run: Run, event: str, data: Any, now: datetime) -> ChainEntry:
    """Append one event to a run's chain.

    The caller holds a transaction and the run's row lock (`_locked_run`, or `select_for_update`): the lock
    serialises writers on one run across processes, and the unique (run, seq) constraint is the backstop if
    anyone ever forgets it. The caller saves the run's head afterwards (`_save_moving`).
    """
    entry = chain.make_entry(
        seq=run.head_seq + 1, ts=chain.format_ts(now), event=event, data=data, prev_hash=run.head_hash
    )
    row = ChainEntry(run_id=run.pk, seq=entry["seq"], ts=entry["ts"], event=event, data=entry["data"],
                     prev_hash=entry["prevHash"], hash=entry["hash"])
    row.pk = sql.insert(ChainEntry, {f: getattr(row, f) for f in ("run_id", "seq", "ts", "event", "data",
                                                                   "prev_hash", "hash")})
    run.head_seq, run.head_hash = entry["seq"], entry["hash"]
    if run.head_seq - run.checkpointed_seq >= settings.RECORDER_CHECKPOINT_EVERY:
        _checkpoint(run=run, now=now)
    return row


def _checkpoint(*, run: Run, now: datetime) -> Checkpoint:
    key_id, private = keys.signing_key()
    payload = chain.checkpoint_payload(run=str(run.public_id), seq=run.head_seq, head_hash=run.head_hash)
    checkpoint = Checkpoint.objects.create(
        run=run, seq=run.head_seq, head_hash=run.head_hash, key_id=key_id,
        signature=chain.sign(private, payload), created_at=now,
    )
    run.checkpointed_seq = run.head_seq
    return checkpoint


def checkpoint_run(*, run: Run, now: datetime | None = None) -> Checkpoint | None:
    """Sign the run's current head, if anything was appended since the last checkpoint."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.head_seq == run.checkpointed_seq:
            return None
        checkpoint = _checkpoint(run=run, now=now or timezone.now())
        run.save(update_fields=["checkpointed_seq"])
        return checkpoint


def record_event(*, run_id: int, event: str, data: Any, now: datetime) -> ChainEntry:
    """Append an event from outside the Recorder (a plan, a check, an approval) to a run's chain.

    Runs inside the caller's transaction if there is one, so the event commits with the change it records."""
    with transaction.atomic():
        run = _locked_run("id = %s", [run_id])
        entry = append_entry(run=run, event=event, data=data, now=now)
        _save_moving(run, now=None)
    return entry


# -- runs and steps ---------------------------------------------------------------------------------------


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


# The run columns a call reads and moves. They are integers and text, so the hot path reads them raw
# (`sql.locked_row`) and writes back only these (`_save_moving`), which keeps each transaction small.
_RUN_MOVING_FIELDS = (
    "step_count", "head_seq", "head_hash", "checkpointed_seq", "state",
    "reversible_count", "irreversible_count", "unknown_count", "failed_count",
)
_RUN_LOCKED_FIELDS = ("id", *_RUN_MOVING_FIELDS)


def _locked_run(where: str, params: list[Any]) -> Run | None:
    return sql.locked_row(Run, _RUN_LOCKED_FIELDS, where, params)


def _save_moving(run: Run, *, now: datetime | None) -> None:
    """Write back the moving columns; `now` is the agent's latest activity (None for events that are not
    the agent's, such as a plan, which must not keep an idle run alive)."""
    values = {name: getattr(run, name) for name in _RUN_MOVING_FIELDS}
    sql.update(Run, run.pk, values if now is None else {**values, "last_activity_at": now})


def _find_run(*, agent: Agent, key: str, now: datetime) -> Run:
    """The agent's run for this key, locked. Without a key, the agent's latest keyless run unless it has
    been idle longer than RECORDER_RUN_IDLE_SECONDS."""
    if key:
        run = _locked_run('agent_id = %s AND "key" = %s', [agent.pk, key])
        if run is None:
            try:
                with transaction.atomic():
                    created = Run.objects.create(agent=agent, key=key, started_at=now, last_activity_at=now)
            except IntegrityError:  # another Recorder process created it a moment ago
                created = Run.objects.get(agent=agent, key=key)
            run = _locked_run("id = %s", [created.pk])
        return run
    idle = sql.prep(Run, "last_activity_at", now - timedelta(seconds=settings.RECORDER_RUN_IDLE_SECONDS))
    run = _locked_run(
        'agent_id = %s AND "key" = %s AND last_activity_at >= %s ORDER BY last_activity_at DESC LIMIT 1',
        [agent.pk, "", idle],
    )
    if run is None:
        created = Run.objects.create(agent=agent, key="", started_at=now, last_activity_at=now)
        run = _locked_run("id = %s", [created.pk])
    return run


def open_step(
    *, agent: Agent, run_key: str, server: ToolServer | None, server_name: str, tool: str,
    arguments: dict[str, Any], request_meta: dict[str, Any] | None, now: datetime, decide=None,
) -> OpenedStep:
    """Journal the intent of an agent's call, before it is forwarded.

    `decide(declaration)`, when given, is the autonomy policy: it returns the decision as a dict
    (`{"decision": "allow"|"ask"|"deny", ...}`), which is kept with the step and in its `call` entry. An
    `ask` opens the step as `held`; the caller then releases it (`release_held_step`) or refuses it
    (`refuse_step`), as it does a `deny`."""
    return _open(lambda: _find_run(agent=agent, key=run_key, now=now), server=server, server_name=server_name,
                 tool=tool, arguments=arguments, request_meta=request_meta, now=now,
                 who={"agent": agent.name, "onBehalfOf": agent.on_behalf_of.get_username()}, decide=decide)


def open_step_in_run(
    *, run_id: int, server: ToolServer, tool: str, arguments: dict[str, Any], request_meta: dict[str, Any] | None,
    now: datetime, who: dict[str, Any],
) -> OpenedStep:
    """Journal the intent of a call that is not an agent's (a compensation the executor makes) in a run
    that is already known, exactly as an agent's call is journaled: `close_step` records what came back."""
    return _open(lambda: _locked_run("id = %s", [run_id]), server=server, server_name=server.name, tool=tool,
                 arguments=arguments, request_meta=request_meta, now=now, who=who)


def _open(find_run, *, server: ToolServer | None, server_name: str, tool: str, arguments: dict[str, Any],
          request_meta: dict[str, Any] | None, now: datetime, who: dict[str, Any], decide=None) -> OpenedStep:
    arguments = to_ijson(arguments)
    request_meta = to_ijson(request_meta) if request_meta else None
    tool_def = server.tool(tool) if server else None
    declaration = declarations.normalise(tool_def or {}, catalogue=server.tool_names if server else set())
    decision = to_ijson(decide(declaration)) if decide is not None else None
    status = Step.Status.HELD if decision and decision.get("decision") == "ask" else Step.Status.PENDING
    with transaction.atomic():
        run = find_run()
        number = run.step_count + 1
        step_id = sql.insert(Step, dict(
            run_id=run.pk, number=number, server_id=server.pk if server else None, server_name=server_name,
            tool=tool, arguments=arguments, request_meta=request_meta, started_at=now,
            declaration=declaration.model_dump(mode="json"), declaration_source=declaration.source,
            reversibility=declaration.kind, status=status, policy_decision=decision,
        ))
        run.step_count = number
        entry = {"step": number, "server": server_name, "tool": tool, "arguments": arguments, **who}
        if decision is not None:
            entry["policy"] = decision
        append_entry(run=run, event="call", now=now, data=entry)
        _save_moving(run, now=now)
    return OpenedStep(step_id=step_id, run_id=run.pk, number=number, server=server, tool=tool, arguments=arguments,
                      request_meta=request_meta, kind=declaration.kind, source=declaration.source, policy=decision)


def release_held_step(*, opened: OpenedStep, approval: dict[str, Any], now: datetime) -> bool:
    """A held call was approved: it may now be forwarded (the step is in flight, like any other call)."""
    with transaction.atomic():
        run = _locked_run("id = %s", [opened.run_id])
        if not sql.update(Step, opened.step_id, {"status": Step.Status.PENDING}, only_if={"status": Step.Status.HELD}):
            return False
        append_entry(run=run, event="released", now=now, data={"step": opened.number, **to_ijson(approval)})
        _save_moving(run, now=None)
    return True


def refuse_step(*, opened: OpenedStep, message: str, now: datetime) -> bool:
    """A call the autonomy policy stopped (denied, or held and not approved in time): nothing was forwarded,
    and the record says why. Only a step still held or not yet forwarded is closed."""
    fields = {"status": Step.Status.ERROR, "is_error": True, "error_message": message,
              "failure_class": Step.FailureClass.POLICY, "finished_at": now}
    with transaction.atomic():
        run = _locked_run("id = %s", [opened.run_id])
        step = Step.objects.filter(pk=opened.step_id).values_list("status", flat=True).first()
        if step not in (Step.Status.HELD, Step.Status.PENDING):
            return False
        sql.update(Step, opened.step_id, fields, only_if={"status": step})
        run.failed_count += 1
        run.state = Run.State.FAILED
        append_entry(run=run, event="result", now=now, data={
            "step": opened.number, "status": Step.Status.ERROR, "isError": True, "result": None,
            "error": message, "failureClass": Step.FailureClass.POLICY, "forwarded": False,
        })
        _save_moving(run, now=now)
    return True


@dataclass(frozen=True)
class Outcome:
    """What came back for a call: a raw result (which may be an `isError` result), or a failure."""

    result: dict[str, Any] | None = None
    error_message: str = ""
    failure_class: str = ""
    may_have_acted: bool = False


def _receipt_check(server: ToolServer | None, journal_raw: Any, parsed) -> tuple[bool | None, str]:
    if parsed is None or parsed.receipt is None:
        return None, ""
    public = (server.receipt_keys if server else {}).get(parsed.receipt.key_id)
    if public is None:
        return False, f"unknown receipt key {parsed.receipt.key_id}"
    body = {k: v for k, v in journal_raw.items() if k != "receipt"}
    try:
        ok = chain.signature_valid(keys.public_key_from_text(public), to_ijson(body), parsed.receipt.signature)
    except ValueError:
        ok = False
    return ok, "" if ok else "the receipt's signature does not verify"


def _undo_facts(step: Step, server: ToolServer | None, result: dict[str, Any], finished: datetime) -> dict[str, Any]:
    """Everything the result says about this call's undo, read through the declaration rules."""
    meta = result.get("_meta") if isinstance(result.get("_meta"), dict) else {}
    journal_raw = meta.get(declarations.HATP_KEY)
    parsed, problems = declarations.parse_call_journal(journal_raw)
    tool_def = server.tool(step.tool) if server else None
    declaration = declarations.normalise(
        tool_def or {}, catalogue=server.tool_names if server else set(),
        call_journal=journal_raw if parsed is not None else None,
    )
    problems = [*problems, *declaration.problems]
    effect = parsed.effect if parsed and parsed.effect else declarations.Effect()
    token = parsed.compensation_token if parsed else None
    compensation_arguments = None
    if declaration.kind == "compensate" and declaration.compensation is not None:
        spec = declaration.compensation
        if spec.dialect == "hatp":
            if not token:
                problems.append("the server declared a compensation but returned no compensation token")
            else:
                compensation_arguments = {"compensationToken": token}
        else:
            response = result.get("structuredContent") if spec.dialect == "sep3172" else result
            try:
                compensation_arguments = resolve_arguments(
                    spec.bindings, dialect=spec.dialect, request=step.arguments, response=response
                )
            except BindingError as exc:
                problems.append(f"a binding does not resolve: {exc}")
        if not effect.version:
            problems.append(declarations.NO_VERSION_PROBLEM)
    deadline = declaration.deadline(finished)
    verified, receipt_problem = _receipt_check(server, journal_raw, parsed)
    return {
        "declaration": declaration.model_dump(mode="json"),
        "declaration_source": declaration.source,
        "reversibility": declaration.kind,
        "compensation_arguments": compensation_arguments,
        "undo_problems": problems,
        "effect_summary": effect.summary or "",
        "effect_resource": effect.resource or "",
        "effect_version": effect.version or "",
        "compensation_token": token or "",
        "undo_by": deadline,
        "receipt": journal_raw.get("receipt") if isinstance(journal_raw, dict) else None,
        "receipt_verified": verified,
        "receipt_problem": receipt_problem,
    }


def close_step(*, opened: OpenedStep, outcome: Outcome, started: datetime, finished: datetime) -> Step | None:
    """Journal what came back, with the undo facts, dependencies and counters, in one transaction.

    Only a `pending` step is closed (a conditional update): if the reconciler already closed it as
    unrecorded, a late answer changes nothing and None is returned."""
    step = Step(pk=opened.step_id, run_id=opened.run_id, number=opened.number, server=opened.server,
                server_name=opened.server.name if opened.server else "", tool=opened.tool,
                arguments=opened.arguments or {}, request_meta=opened.request_meta)
    fields: dict[str, Any] = {"finished_at": finished, "duration_ms": (finished - started).total_seconds() * 1000}
    if outcome.result is not None:
        result = to_ijson(outcome.result)
        is_error = result.get("isError") is True
        fields.update(result=result, is_error=is_error, status=Step.Status.ERROR if is_error else Step.Status.OK)
        if is_error:
            fields["failure_class"] = classify_tool_error(result)
        else:
            fields.update(_undo_facts(step, step.server, result, finished))
    else:
        fields.update(status=Step.Status.ERROR, is_error=True, error_message=outcome.error_message,
                      failure_class=outcome.failure_class or Step.FailureClass.UNKNOWN)
        if outcome.may_have_acted:
            fields.update(reversibility=Step.Reversibility.UNKNOWN, undo_problems=[
                "the server did not answer, so it may or may not have acted"])

    with transaction.atomic():
        run = _locked_run("id = %s", [opened.run_id])
        if not sql.update(Step, step.pk, fields, only_if={"status": Step.Status.PENDING}):
            logger.warning("step %s of run %s was already closed; this late outcome is not recorded",
                           opened.number, opened.run_id)
            return None
        for name, value in fields.items():
            setattr(step, name, value)
        step.reversibility = fields.get("reversibility", opened.kind)
        step.declaration_source = fields.get("declaration_source", opened.source)
        step.undo_problems = fields.get("undo_problems", [])
        _count(run, step, acted=(outcome.result is not None and not step.is_error) or outcome.may_have_acted)
        links = _link(run, step)
        append_entry(run=run, event="result", now=finished, data={
            "step": step.number,
            "status": step.status,
            "isError": step.is_error,
            "result": step.result,
            "error": step.error_message or None,
            "failureClass": step.failure_class or None,
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
        _save_moving(run, now=finished)
    return step


def _count(run: Run, step: Step, *, acted: bool) -> None:
    """Keep the run list's counters. A failed call counts as failed; only calls that acted (or may have,
    when the server never answered) count towards reversible, irreversible or unknown."""
    if step.status == Step.Status.ERROR:
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
        by_digest: dict[str, list[str]] = {}
        for value_digest, pointer in wanted:
            by_digest.setdefault(value_digest, []).append(pointer)
        found: dict[int, list[dict[str, str]]] = {}
        earlier = ResultValue.objects.filter(run=run, digest__in=list(by_digest)).values_list("step_id", "digest", "pointer")
        for step_id, value_digest, pointer in earlier:
            if step_id == step.pk:
                continue
            for to in by_digest[value_digest]:
                found.setdefault(step_id, []).append({"from": pointer, "to": to})
        numbers = dict(Step.objects.filter(pk__in=list(found)).values_list("pk", "number"))
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
        ResultValue.objects.bulk_create([
            ResultValue(run=run, step=step, digest=value_digest, pointer=pointer)
            for value_digest, pointer in dependencies.distinctive_values(structured, "/structuredContent")
        ])
    return links


def refresh_catalogue(*, server: ToolServer) -> ToolServer:
    """Read the server's raw `tools/list` and keep it. Called outside any transaction (it is network I/O),
    from commands, the admin and tests; the Recorder itself reads what was kept."""
    import anyio

    from .mcp.client import ToolServerError, Upstreams, endpoint_of

    endpoint = endpoint_of(server)

    async def fetch():
        async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
            return await upstreams.list_tools(endpoint)

    try:
        tools = anyio.run(fetch)
    except ToolServerError as exc:
        return save_catalogue(server=server, tools=None, error=f"Could not read the catalogue: {exc.message}")
    return save_catalogue(server=server, tools=tools)


# -- the run record: verify, export, import ---------------------------------------------------------------


def verify_run(*, run: Run) -> chain.Verdict:
    """Check a run's chain and checkpoints. Entries are read in the order they were stored (by row id), not
    sorted by `seq`, so a reordering shows up as a wrong seq."""
    entries = (entry.as_wire() for entry in run.entries.order_by("id").iterator(chunk_size=2000))
    checkpoints = [checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")]
    return chain.verify(
        run=str(run.public_id), entries=entries, checkpoints=checkpoints,
        public_keys=keys.public_keys(origin=run.imported_from if run.state == Run.State.IMPORTED else ""),
    )


def export_bundle(*, run: Run) -> dict[str, Any]:
    """The run's record as a self-contained bundle; signs the head first so the whole chain is covered."""
    checkpoint_run(run=run)
    run.refresh_from_db()
    origin = run.imported_from if run.state == Run.State.IMPORTED else ""
    from .models import RecorderKey

    return {
        "format": "agent-undo/run-bundle@1",
        "run": {
            "id": str(run.public_id),
            "agent": run.agent_name,
            "onBehalfOf": run.agent.on_behalf_of.get_username() if run.agent_id else None,
            "startedAt": run.started_at.isoformat(),
            "recorder": origin or settings.PUBLIC_URL,
        },
        "entries": [entry.as_wire() for entry in run.entries.order_by("seq")],
        "checkpoints": [checkpoint.as_wire() for checkpoint in run.checkpoints.order_by("seq").select_related("run")],
        "publicKeys": [key.as_wire() for key in RecorderKey.objects.filter(origin=origin)],
        "approvals": _approvals(run),
    }


def _approvals(run: Run) -> list[dict[str, Any]]:
    """The signed approvals of the run's plans (the approval side owns them; an imported run has none)."""
    from approver.services import approvals_for_bundle

    return approvals_for_bundle(run)


def _parse_ts(text: str, fallback: datetime) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return fallback
    return moment if moment.tzinfo else fallback


def _steps_from_entries(run: Run, entries: list[dict[str, Any]]) -> list[Step]:
    """Rebuild the step rows of an imported run from its call and result events."""
    steps: dict[int, Step] = {}
    for entry in entries:
        data = entry["data"] if isinstance(entry["data"], dict) else {}
        number = data.get("step")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            continue
        at = _parse_ts(entry["ts"], run.started_at)
        if entry["event"] == "call" and number not in steps:
            arguments = data.get("arguments")
            steps[number] = Step(
                run=run, number=number, server_name=str(data.get("server", ""))[:60], tool=str(data.get("tool", ""))[:200],
                arguments=arguments if isinstance(arguments, dict) else {}, started_at=at,
            )
        elif entry["event"] == "result" and number in steps:
            step = steps[number]
            undo = data.get("undo") if isinstance(data.get("undo"), dict) else {}
            effect = data.get("effect") if isinstance(data.get("effect"), dict) else {}
            step.status = Step.Status.ERROR if data.get("status") == "error" else Step.Status.OK
            step.is_error = data.get("isError") is True
            step.result = data.get("result") if isinstance(data.get("result"), dict) else None
            step.failure_class = str(data.get("failureClass") or "")[:20]
            step.finished_at = at
            kind = undo.get("kind")
            step.reversibility = kind if kind in Step.Reversibility.values else Step.Reversibility.UNKNOWN
            step.declaration_source = str(undo.get("source") or "")[:40]
            step.compensation_arguments = undo.get("compensationArguments") if isinstance(
                undo.get("compensationArguments"), dict) else None
            problems = undo.get("problems")
            step.undo_problems = [str(p) for p in problems] if isinstance(problems, list) else []
            step.undo_by = _parse_ts(undo.get("undoBy") or "", None) if undo.get("undoBy") else None
            step.effect_summary = str(effect.get("summary") or "")[:500]
            step.effect_resource = str(effect.get("resource") or "")[:500]
            step.effect_version = str(effect.get("version") or "")[:200]
            step.receipt_verified = data.get("receiptVerified") if isinstance(data.get("receiptVerified"), bool) else None
    return [steps[n] for n in sorted(steps)]


def import_bundle(*, text: str) -> Run:
    """Import another Recorder's bundle after verifying it; all or nothing."""
    import uuid

    from .bundle import ImportRefused, parse_bundle, verify_bundle
    from .models import RecorderKey

    bundle = parse_bundle(text)
    try:
        public_id = uuid.UUID(bundle.run.id)
    except ValueError:
        raise ImportRefused(f"run.id: {bundle.run.id!r} is not a UUID") from None
    verdict = verify_bundle(bundle)
    if not verdict.ok:
        raise ImportRefused(f"the record does not verify: {verdict}")
    if not bundle.checkpoints:
        raise ImportRefused("the bundle has no signed checkpoint, so nothing vouches for its entries")
    if bundle.checkpoints[-1].seq != bundle.entries[-1].seq:
        raise ImportRefused(f"entries after seq {bundle.checkpoints[-1].seq} are not covered by a signed checkpoint")
    if Run.objects.filter(public_id=public_id).exists():
        raise ImportRefused(f"run {public_id} is already here")
    origin = bundle.run.recorder
    started = _parse_ts(bundle.run.startedAt, timezone.now())
    entries = [entry.model_dump() for entry in bundle.entries]
    with transaction.atomic():
        run = Run.objects.create(
            public_id=public_id, state=Run.State.IMPORTED, imported_from=origin, agent_label=bundle.run.agent,
            started_at=started, last_activity_at=started,
            head_seq=entries[-1]["seq"], head_hash=entries[-1]["hash"], checkpointed_seq=bundle.checkpoints[-1].seq,
        )
        ChainEntry.objects.bulk_create([
            ChainEntry(run=run, seq=e["seq"], ts=e["ts"], event=e["event"], data=e["data"], prev_hash=e["prevHash"],
                       hash=e["hash"]) for e in entries
        ])
        Checkpoint.objects.bulk_create([
            Checkpoint(run=run, seq=c.seq, head_hash=c.headHash, key_id=c.keyId, signature=c.signature)
            for c in bundle.checkpoints
        ])
        for key in bundle.publicKeys:
            existing = RecorderKey.objects.filter(origin=origin, key_id=key.keyId).first()
            if existing and existing.public_key != key.publicKey:
                raise ImportRefused(f"publicKeys: {key.keyId} of {origin} differs from the key imported before")
            if not existing:
                RecorderKey.objects.create(
                    origin=origin, key_id=key.keyId, public_key=key.publicKey,
                    valid_from=_parse_ts(key.validFrom, started),
                    valid_until=_parse_ts(key.validUntil, None) if key.validUntil else None,
                )
        steps = _steps_from_entries(run, entries)
        Step.objects.bulk_create(steps)
        _recount(run, steps)
        run.save()
    return run


def _recount(run: Run, steps: list[Step]) -> None:
    run.step_count = len(steps)
    for step in steps:
        _count(run, step, acted=step.status == Step.Status.OK)
    run.state = Run.State.IMPORTED


def import_chronomcp_log(*, text: str, source: str) -> Run:
    """Import a ChronoMCP audit log after verifying its own chain. Its entries are kept verbatim inside a
    new chain of ours (their hashes use JSON.stringify, ours JCS), which this Recorder then signs."""
    from .bundle import ImportRefused, parse_chronomcp_log

    parsed = parse_chronomcp_log(text)
    key = f"chronomcp:{parsed[-1][1].hash}"
    if Run.objects.filter(key=key).exists():
        raise ImportRefused("this audit log (same last hash) was imported before")
    now = timezone.now()
    first_ts = _parse_ts(parsed[0][1].ts, now)
    with transaction.atomic():
        run = Run.objects.create(state=Run.State.IMPORTED, imported_from="", agent_label="chronomcp",
                                 key=key, started_at=first_ts,
                                 last_activity_at=_parse_ts(parsed[-1][1].ts, now))
        append_entry(run=run, event="imported", now=now, data={
            "format": "chronomcp-audit-log", "source": source, "entries": len(parsed), "headHash": parsed[-1][1].hash})
        steps = []
        for line, (raw, entry) in enumerate(parsed, start=1):
            append_entry(run=run, event="chronomcp", now=now, data={"line": line, "entry": raw})
            if entry.tool:
                arguments = entry.data.get("args", entry.data.get("arguments", entry.data))
                steps.append(Step(
                    run=run, number=len(steps) + 1, server_name="chronomcp", tool=entry.tool[:200],
                    arguments=to_ijson(arguments if isinstance(arguments, dict) else {"value": arguments}),
                    started_at=_parse_ts(entry.ts, now), finished_at=_parse_ts(entry.ts, now),
                    status=Step.Status.OK, declaration_source="none", reversibility=Step.Reversibility.UNKNOWN,
                    effect_summary=f"ChronoMCP {entry.kind}"[:500],
                ))
        Step.objects.bulk_create(steps)
        _recount(run, steps)
        _checkpoint(run=run, now=now)
        run.save()
    return run


MAX_HOLD_SECONDS = 3600  # the longest a policy may hold a call (approver.services.clean_policy)


def reconcile_stale_steps(*, older_than: datetime, now: datetime | None = None) -> int:
    """Close steps still `pending` long after any call could have lasted: the Recorder stopped (or its
    database failed) between forwarding a call and recording the answer. The server may have acted, so the
    step becomes a failed call whose outcome is unknown, never a silent gap in the record. A step still
    `held` after the longest hold was never forwarded: it is closed as such."""
    now = now or timezone.now()
    closed = 0
    held_before = older_than - timedelta(seconds=MAX_HOLD_SECONDS)
    for step in Step.objects.filter(status=Step.Status.HELD, started_at__lt=held_before).iterator():
        opened = OpenedStep(step_id=step.pk, run_id=step.run_id, number=step.number)
        closed += refuse_step(opened=opened, now=now, message=(
            "The Recorder stopped while this call waited for approval; it was never forwarded."))
    stale = Step.objects.filter(status=Step.Status.PENDING, started_at__lt=older_than).select_related("server")
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


def reset_agent_token(*, agent: Agent) -> str:
    """Give an agent a new token; the old one stops working at once."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    agent.token_hash, agent.token_prefix = hash_token(token), token[:10]
    agent.save(update_fields=["token_hash", "token_prefix"])
    return token
