"""Asking tool servers, without changing anything, whether each undo in a plan would work right now.

All traffic goes through the one client (`journal.upstream.client.Upstreams`), with its timeout on every call.
Items are checked concurrently, at most `per_server` at a time on any one server. A server's answers are
untrusted input: only the fields the plan page shows are kept, as bounded strings.

- HATP: the server's own `hatp_check` with the compensation token, `ifVersion` and the idempotency key.
- SEP-3172 and mcp-compensate have no check call, so: the compensating tool must still be in the server's
  current catalogue (read once per server), its input schema must accept the resolved arguments, and the
  undo window must be open.
- An admin's recipe that read the record before the call: the same read again, its version compared with
  what the agent left (the undo would work), what was there before (undone already) or anything else (a
  conflict: someone changed it since). Without a read, as SEP-3172.
"""

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import jsonschema

from journal.telemetry import tracing
from journal.undo import recipes
from journal.undo.outcomes import classify_tool_error
from journal.undo.recipe_text import brief, field_changes, three_way
from journal.upstream.client import Endpoint, ToolServerError, Upstreams
from journal.upstream.recipe_reads import read_state

from . import answers, database_checks

HATP_CHECK = "hatp_check"


LATER_CHANGES = "later changes"  # a CheckTarget's run_left when later calls changed other records of it
STATE_SHOWN_BYTES = 256 * 1024  # a recipe's record read now, kept to show a conflict three ways


@dataclass(frozen=True)
class CheckTarget:
    item_id: int
    endpoint: Endpoint
    dialect: str
    tool: str
    arguments: dict[str, Any]
    if_version: str
    idempotency_key: str
    undo_by: datetime | None
    earlier: dict[str, Any] | None = None  # a recipe's read before the call (`journal.undo.recipes`)
    # Where the agent's run left that record, when later calls in the plan changed it again (their undos come
    # first), or LATER_CHANGES when they changed the server's records another way; else "".
    run_left: str = ""
    # The changed fields' values before and after the call, when its server gave them (`Step.effect_fields`).
    effect_fields: dict[str, Any] | None = None
    database: str = ""  # a database undo's: where its rows are, as the Recorder reaches it
    # A database undo's: the rows of the plan's undos that run before it on its database, the one run last
    # first (`journal.upstream.captured.chained_rows`).
    chained: list | None = None


@dataclass(frozen=True)
class CheckResult:
    status: str  # ok | conflict | expired | unavailable | error
    detail: dict[str, Any]


def _error(failure_class: str, message: str) -> CheckResult:
    return CheckResult("error", {"failureClass": failure_class, "message": answers.bounded(message)})


def _from_failure(exc: ToolServerError) -> CheckResult:
    if exc.transient:
        return CheckResult(
            "unavailable", {"failureClass": exc.failure_class, "message": answers.bounded(exc.message)}
        )
    return _error(exc.failure_class, exc.message)


def read_hatp_answer(result: dict[str, Any], effect_fields: dict[str, Any] | None = None) -> CheckResult:
    """A `hatp_check` answer, read as docs/design.md's UNDO_* contract. A conflict whose server gave the
    record's field values now is shown three ways (before the agent, what it left, now) with the call's own
    `effect_fields`; one that gave none keeps what it gave (`fieldsGiven: false` says so)."""
    content, message = answers.structured(result), answers.first_text(result)
    if result.get("isError") is not True and answers.says_undone(
        result
    ):  # it happened already (docs/design.md)
        return _error(
            "business_rule", f"Already undone: {answers.bounded(content.get('summary')) or message}"
        )
    if result.get("isError") is not True:
        return CheckResult("ok", {"wouldDo": answers.bounded(content.get("wouldDo") or content.get("would"))
                                  or message})
    code = content.get("code")
    if code == "UNDO_CONFLICT":
        current = answers.conflict_current(content)
        detail = {"message": message, "current": current}
        if "fields" in current:
            effect = effect_fields or {}
            detail["threeWay"] = field_changes(effect.get("before"), effect.get("after"), current["fields"])
        else:
            detail["fieldsGiven"] = False
        return CheckResult("conflict", detail)
    if code == "UNDO_EXPIRED":
        return CheckResult("expired", {"message": message})
    return _error(classify_tool_error(result), message or "The server refused the check.")


def chained(result: CheckResult, target: CheckTarget) -> CheckResult:
    """A HATP conflict that is only the run's own later change to the record, which the plan undoes first
    (the record is where the run left it, `run_left`): not a conflict. Its undo is sent conditional on the
    version the plan's own earlier undo leaves (`after`: the version that undo starts from), so anyone
    else's change meanwhile still stops it."""
    current = (result.detail.get("current") or {}).get("version")
    if result.status != "conflict" or not target.run_left or current != target.run_left:
        return result
    return CheckResult("ok", {"chained": CHAINED, "after": current})


# A chained undo, in words after what it does (`PlanItem.undo_words`): the record's version is behind Details.
CHAINED = ("once the undos of the run's later changes to this record have run first: changed since only by "
           "the run itself, as it left it")


def read_catalogue(catalogue: list[dict[str, Any]], target: CheckTarget) -> CheckResult:
    """The compensating tool is listed now, and its input schema accepts the resolved arguments."""
    tool = next((t for t in catalogue if isinstance(t, dict) and t.get("name") == target.tool), None)
    if tool is None:
        return CheckResult(
            "unavailable",
            {
                "message": f"{target.endpoint.name} no longer lists {target.tool}, the tool that would undo "
                           f"this."
            },
        )
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict):
        return _error(
            "invalid_arguments", f"{target.tool} publishes no input schema to check the arguments against."
        )
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
        problem = jsonschema.exceptions.best_match(validator_class(schema).iter_errors(target.arguments))
    except (jsonschema.exceptions.SchemaError, RecursionError, TypeError, ValueError):
        return _error("invalid_arguments", f"{target.tool}'s input schema is not a valid JSON Schema.")
    if problem is not None:
        return _error("invalid_arguments", f"{target.tool} would refuse the arguments: {problem.message}")
    return CheckResult("ok", {"wouldDo": answers.bounded(_in_its_words(tool, target))})


def _in_its_words(tool: dict[str, Any], target: CheckTarget) -> str:
    """A compensating call as its server describes its tool, with what it is called on: "Refund a charge in
    full: refund_payment {transactionId: "txn_…"} on payments"."""
    described = tool.get("title") or tool.get("description")
    said = described.strip().split("\n")[0].rstrip(". ") if isinstance(described, str) else ""
    call = f"{brief(target.tool, target.arguments)} on {target.endpoint.name}"
    return f"{said[:200]}: {call}" if said else f"Call {call}"


async def check_all(targets: list[CheckTarget], *, upstreams: Upstreams, now: datetime, per_server: int,
                    timeout: float, on_result: Callable[[int, CheckResult], Awaitable[None]]) -> None:
    """Check every target; `on_result(item_id, result)` is awaited as each answer arrives."""
    limits: dict[str, anyio.Semaphore] = {}
    catalogues: dict[str, Any] = {}  # server name -> (event, result) so each catalogue is read once

    async def catalogue_of(endpoint: Endpoint) -> list[dict[str, Any]] | ToolServerError:
        entry = catalogues.get(endpoint.name)
        if entry is None:
            entry = catalogues[endpoint.name] = {"ready": anyio.Event(), "value": None}
            try:
                entry["value"] = await upstreams.list_tools(endpoint, timeout=timeout)
            except ToolServerError as exc:
                entry["value"] = exc
            entry["ready"].set()
        await entry["ready"].wait()
        return entry["value"]

    async def check(target: CheckTarget) -> None:
        with tracing.child_span(f"check {target.tool}", {"undo.server": target.endpoint.name,
                                                         "gen_ai.tool.name": target.tool}) as span:
            if target.undo_by is not None and target.undo_by <= now:
                result = CheckResult(
                    "expired", {"message": f"The undo window closed at {target.undo_by.isoformat()}."}
                )
            else:
                limit = limits.setdefault(target.endpoint.name, anyio.Semaphore(per_server))
                async with limit:
                    result = await check_one(
                        target, upstreams=upstreams, timeout=timeout, catalogue_of=catalogue_of
                    )
            if span is not None:
                span.set_attribute("undo.check.result", result.status)
        await on_result(target.item_id, result)

    async with anyio.create_task_group() as group:
        for target in targets:
            group.start_soon(check, target)


async def check_one(
    target: CheckTarget, *, upstreams: Upstreams, timeout: float, catalogue_of=None
) -> CheckResult:
    """One item's check; `catalogue_of(endpoint)` shares catalogue reads between items (default: read it)."""
    if target.dialect == "hatp":
        arguments = {
            **target.arguments,
            "ifVersion": target.if_version,
            "idempotencyKey": target.idempotency_key,
        }
        try:
            answer = await upstreams.call_tool(target.endpoint, HATP_CHECK, arguments, timeout=timeout)
        except ToolServerError as exc:
            return _from_failure(exc)
        return chained(read_hatp_answer(answer, target.effect_fields), target)
    if target.dialect == "database":
        status, detail = await anyio.to_thread.run_sync(functools.partial(
            database_checks.check, place=target.database, earlier=target.earlier, chained=target.chained))
        return CheckResult(status, detail)
    if target.dialect == "recipe" and (target.earlier or {}).get("version"):
        return await check_recipe(target, upstreams=upstreams, timeout=timeout)
    try:
        catalogue = await (catalogue_of or upstreams.list_tools)(target.endpoint)
    except ToolServerError as exc:
        catalogue = exc
    if isinstance(catalogue, ToolServerError):
        return _from_failure(catalogue)
    return read_catalogue(catalogue, target)


async def check_recipe(target: CheckTarget, *, upstreams: Upstreams, timeout: float) -> CheckResult:
    """A recipe undo's three-state check (see the module)."""
    earlier = target.earlier
    try:
        now, now_state = await read_state(upstreams, target.endpoint, earlier, timeout=timeout,
                                          limit=STATE_SHOWN_BYTES)
    except ToolServerError as exc:
        return _from_failure(exc)
    except ValueError as exc:
        return _error("unknown", f"{target.endpoint.name} could not be read as before the call: {exc}.")
    state = recipes.three_state(before=earlier["version"], after=target.if_version, now=now)
    does = (earlier.get("does") or "put back what was read before the call").capitalize()
    if state == "conflict" and target.run_left and now == target.run_left:
        return CheckResult("ok", {"wouldDo": answers.bounded(
            f"{does}: {target.tool}, once the undos of the run's later changes to it have run.")})
    if state == "conflict" and target.run_left == LATER_CHANGES:
        return CheckResult("ok", {"wouldDo": answers.bounded(
            f"{does}: {target.tool}, once the undos of the run's later calls to {target.endpoint.name} have "
            "run. It reads differently now, as those calls left it: just before it runs it is read again, "
            "and nothing is sent unless it is where the agent left it.")})
    if state == "ok":
        does = earlier.get("does") or f"put back what {earlier['tool']} read before the call"
        return CheckResult("ok", {"wouldDo": answers.bounded(f"{does[0].upper()}{does[1:]}: {target.tool}.")})
    if state == "undone":
        return _error("business_rule", "Already undone: it reads as it did before the agent's call.")
    detail = {"message": f"Changed since the agent's call: {earlier['tool']} reads differently now.",
              "current": {"version": now, "summary": "changed since the agent's call"}}
    if "structured" in earlier and now_state is not None:  # what changed, three ways
        detail["threeWay"] = three_way(earlier["structured"], earlier.get("left"), now_state)
    return CheckResult("conflict", detail)
