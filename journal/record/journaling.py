"""How a call is journaled, as pure functions: no ORM, no clock, no settings (the caller passes them in).

A call is journaled twice (`journal.services.steps`): its intent before it is forwarded (`prepared` and
`call_entry`), and what came of it after (`closed_fields`, `result_entry`, `counters`). The service only
locks the run, writes what these return, and appends the entries; every judgment of what an outcome means
for the record is here, one case a function, and `tests/journal/record/test_journaling.py` checks each
without a database.
"""

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..undo import declarations, outcomes, recipes, recovery
from ..undo.database import judging
from .canonical import sha256_hex, to_ijson
from .chain import format_ts

# The step's states and the other choices this module writes, as `journal.models.Step` names them.
PENDING, HELD, OK, ERROR, UNDELIVERED, CANCELLED = (
    "pending",
    "held",
    "ok",
    "error",
    "undelivered",
    "cancelled",
)
COMPENSATE, NONE, UNKNOWN, READ_ONLY = "compensate", "none", "unknown", "read_only"
INLINE, JOURNAL, DROPPED = "inline", "journal", "dropped"
UNKNOWN_FAILURE = "unknown"


@dataclass(frozen=True)
class Outcome:
    """What came back for a call: a raw result (which may be an `isError` result), or a failure.
    `undelivered` says why a result the server sent never reached the agent (the server acted all the
    same)."""

    result: dict[str, Any] | None = None
    error_message: str = ""
    failure_class: str = ""
    may_have_acted: bool = False
    undelivered: str = ""
    after_version: str = ""  # the version of the record just after the call (an admin's recipe read it)
    after_state: Any = None  # and what it read then (its `structuredContent`), when within the bound kept
    cancelled: str = (
        ""  # why the agent never waited for the answer (with may_have_acted once the server had it)
    )
    oversized: Any = None  # a `journal.upstream.bounded.Oversized`: the server answered over the limit
    recovery: dict[str, Any] | None = (
        None  # what the agent was advised to do about a failure (journal.undo.recovery)
    )


# -- the intent ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """An agent's call as it will be journaled: I-JSON arguments and `_meta`, the tool's declaration, what
    the advice after a failure needs to know of the tool, and the digest the retry guard finds repeats by."""

    arguments: dict[str, Any]
    request_meta: dict[str, Any] | None
    declaration: declarations.UndoDeclaration
    traits: recovery.Tool
    digest: str
    guarded: bool = field(
        default=False
    )  # whether a repeat after an unknown outcome is held (the retry guard)


def prepared(
    *,
    arguments: dict[str, Any],
    request_meta: dict[str, Any] | None,
    tool_def: dict[str, Any] | None,
    catalogue: set[str],
    agent: str | None,
    server_name: str,
    tool: str,
    recipe: dict[str, Any] | None = None,
    listing: list[Any] = (),
    earlier: dict[str, Any] | None = None,
) -> Prepared:
    """The call as it is journaled and decided on. `recipe` is an admin's for the tool, if its server has
    one (`listing`: the server's whole catalogue, which the recipe is checked against), and `earlier` what
    its earlier-state read found just before (`recipes.earlier_state`)."""
    arguments = to_ijson(arguments)
    declaration = recipes.declaration_for(tool_def, catalogue=catalogue, recipe=recipe, listing=listing,
                                          earlier=earlier)
    traits = recovery.tool_of(tool_def, kind=declaration.kind)
    return Prepared(
        arguments=arguments,
        request_meta=to_ijson(request_meta) if request_meta else None,
        declaration=declaration,
        traits=traits,
        digest=sha256_hex({"agent": agent, "server": server_name, "tool": tool,
                           "arguments": declared_arguments(arguments, tool_def)}),
        guarded=recovery.needs_retry_guard(kind=declaration.kind, idempotent=traits.idempotent),
    )


def agent_journal(request_meta: Any) -> dict[str, Any]:
    """What the agent sent under `_meta["hatp/journal"]`, or {} when it sent no object there: the agent
    controls every byte of it, so nothing that reads it assumes a shape."""
    journal = request_meta.get(declarations.HATP_KEY) if isinstance(request_meta, dict) else None
    return journal if isinstance(journal, dict) else {}


def declared_dependencies(request_meta: Any, *, before: int) -> set[int]:
    """The earlier steps the agent declared this call depends on (`dependsOn`: step numbers below `before`);
    anything else it sent there is ignored."""
    declared = agent_journal(request_meta).get("dependsOn")
    if not isinstance(declared, list):
        return set()
    return {n for n in declared if isinstance(n, int) and not isinstance(n, bool) and 0 < n < before}


def declared_arguments(arguments: dict[str, Any], tool_def: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments the tool's input schema declares (all of them when it declares none): what the retry
    guard finds repeats by, so adding an argument the tool ignores does not make a call new."""
    schema = tool_def.get("inputSchema") if isinstance(tool_def, dict) else None
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        return arguments
    return {key: value for key, value in arguments.items() if key in properties}


def opening_status(decision: dict[str, Any] | None) -> str:
    """A call the policy asks a person about opens `held`; any other opens in flight."""
    return HELD if decision and decision.get("decision") == "ask" else PENDING


def step_columns(call: Prepared, *, server, server_name: str, tool: str, now: datetime,
                 status: str, decision: dict[str, Any] | None) -> dict[str, Any]:
    """A new step's columns as the call's intent sets them (but its run and number), the same whichever way
    it is journaled (`steps._open`, `one_statement.open_agent_call`)."""
    declaration = call.declaration
    return {"server_id": server.pk if server else None, "server_name": server_name, "tool": tool,
            "arguments": call.arguments, "request_meta": call.request_meta, "started_at": now,
            "status": status, "policy_decision": decision, "call_digest": call.digest,
            "declaration": declaration.model_dump(mode="json"), "declaration_source": declaration.source,
            "reversibility": declaration.kind}


def halted_decision(decision: dict[str, Any] | None, *, why: str, plan: Any) -> dict[str, Any]:
    """An agent's call into a run a failure stopped: denied, naming the plan that stopped the run."""
    return {
        "decision": "deny",
        "class": (decision or {}).get("class", "unknown"),
        "reason": why,
        "haltedBy": plan,
    }


def call_entry(*, number: int, server_name: str, tool: str, call: Prepared, who: dict[str, Any],
               decision: dict[str, Any] | None) -> dict[str, Any]:
    """The chain's `call` entry: what goes out, with who asks and what the policy decided."""
    return {**call_entry_asked(server_name=server_name, tool=tool, call=call, who=who),
            **call_entry_decided(number=number, decision=decision)}


def call_entry_asked(*, server_name: str, tool: str, call: Prepared, who: dict[str, Any]) -> dict[str, Any]:
    """The members of a `call` entry known before its run is locked: what goes out and who asks."""
    entry = {"server": server_name, "tool": tool, "arguments": call.arguments, **who}
    if call.request_meta:
        entry["meta"] = call.request_meta  # what goes out with the arguments, so the record covers it too
    return entry


def call_entry_decided(*, number: int, decision: dict[str, Any] | None) -> dict[str, Any]:
    """The members of a `call` entry its run's lock decides: the step's number, and what the policy decided
    (a halt found under the lock changes it)."""
    return {"step": number, **({"policy": decision} if decision is not None else {})}


# -- the outcome --------------------------------------------------------------------------------------------


def measured(result: dict[str, Any]) -> tuple[int, str]:
    """The size and SHA-256 of a result as compact JSON."""
    body = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
    return len(body), hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class Tool:
    """What reading a result needs to know of the tool and its server."""

    definition: dict[str, Any] | None = None
    catalogue: frozenset[str] = frozenset()
    receipt_keys: dict[str, str] = field(default_factory=dict)
    recipe: dict[str, Any] | None = None  # an admin's, for a tool its server says nothing about
    listing: list[Any] = field(default_factory=list)  # the server's whole catalogue, for the recipe
    earlier: dict[str, Any] | None = None  # what the recipe's read found just before the call


def closed_fields(*, outcome: Outcome, tool: Tool, arguments: dict[str, Any], started: datetime,
                  finished: datetime, inline_limit: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The step's fields once `outcome` came back, and the result as journaled (I-JSON), or None."""
    fields: dict[str, Any] = {
        "finished_at": finished,
        "duration_ms": (finished - started).total_seconds() * 1000,
    }
    result = None
    if outcome.result is not None:
        result = to_ijson(outcome.result)
        fields.update(_answered(result, outcome, tool=tool, arguments=arguments, finished=finished,
                                inline_limit=inline_limit))
    elif outcome.oversized is not None:
        fields.update(_oversized(outcome))
    elif outcome.cancelled:
        fields.update(_cancelled(outcome))
    else:
        fields.update(_failed(outcome))
    if outcome.recovery is not None:
        fields["recovery"] = to_ijson(outcome.recovery)
    if (rows := judging.database_rows(outcome.after_state)) is not None:  # the rows a database's capture kept
        fields["earlier_state"] = {**(tool.earlier or {}), "left": outcome.after_state}
        declared = fields.get("reversibility") or judging.from_state(tool.earlier or {}).kind
        kept = [k for k in ((tool.earlier or {}).get("database") or {}).get("kept") or ()
                if k.get("table") in (rows.get("destroyed") or ())]  # what it did destroy, kept before
        fields.update(judging.after_call(rows, kind=declared, kept=kept))
    return fields, result


def _answered(result: dict[str, Any], outcome: Outcome, *, tool: Tool, arguments: dict[str, Any],
              finished: datetime, inline_limit: int) -> dict[str, Any]:
    """The server answered: its result, kept inline when small, and the undo facts when it succeeded."""
    is_error = result.get("isError") is True
    size, digest = measured(result)
    inline = size <= inline_limit
    fields = {"result": result if inline else None, "result_size": size, "result_sha256": digest,
              "result_storage": INLINE if inline else JOURNAL, "is_error": is_error,
              "status": ERROR if is_error else OK}
    if is_error:
        fields["failure_class"] = outcomes.classify_tool_error(result)
    else:
        fields.update(outcomes.undo_facts(tool_def=tool.definition, catalogue=set(tool.catalogue),
                                          receipt_keys=tool.receipt_keys, arguments=arguments, result=result,
                                          finished=finished, recipe=tool.recipe, listing=tool.listing,
                                          earlier=tool.earlier, after_version=outcome.after_version))
        if tool.earlier and outcome.after_state is not None:  # kept for a conflict's three-way view
            fields["earlier_state"] = {**tool.earlier, "left": outcome.after_state}
    if result.get("resultType") == "input_required":  # 2026-07-28: asked for more before doing anything
        fields.update(reversibility=READ_ONLY, undo_problems=[], compensation_arguments=None,
                      compensation_then=None, effect_summary="The server asked for more input before acting.")
    if outcome.undelivered:
        fields.update(status=UNDELIVERED, error_message=outcome.undelivered, may_have_acted=True)
    return fields


def _oversized(outcome: Outcome) -> dict[str, Any]:
    """The server answered over the size limit: it acted, and nothing of its answer was kept."""
    return {
        "status": UNDELIVERED,
        "error_message": outcome.undelivered,
        "may_have_acted": True,
        "result_size": outcome.oversized.size,
        "result_sha256": outcome.oversized.sha256,
        "result_storage": DROPPED,
        "reversibility": UNKNOWN,
        "undo_problems": [
            "the server answered over the Recorder's size limit and its answer was not kept, "
            "so what it did is unknown"
        ],
    }


def _cancelled(outcome: Outcome) -> dict[str, Any]:
    """The agent cancelled: once the server had the call it may have acted; before, nothing happened."""
    if outcome.may_have_acted:
        return {
            "status": CANCELLED,
            "error_message": outcome.cancelled,
            "may_have_acted": True,
            "reversibility": UNKNOWN,
            "undo_problems": [
                "the agent cancelled the call while the server had it, so it may or may not have acted"
            ],
        }
    return {
        "status": CANCELLED,
        "error_message": outcome.cancelled,
        "reversibility": READ_ONLY,
        "undo_problems": [],
    }


def _failed(outcome: Outcome) -> dict[str, Any]:
    """No answer: a failed call, which may have acted when the server had it and never answered."""
    fields = {"status": ERROR, "is_error": True, "error_message": outcome.error_message,
              "failure_class": outcome.failure_class or UNKNOWN_FAILURE}
    if outcome.may_have_acted:
        fields.update(may_have_acted=True, reversibility=UNKNOWN,
                      undo_problems=["the server did not answer, so it may or may not have acted"])
    return fields


def acted(outcome: Outcome, *, is_error: bool) -> bool:
    """Whether the call acted (or may have): only those count towards reversible, irreversible or unknown."""
    return (
        (outcome.result is not None and not is_error)
        or outcome.may_have_acted
        or outcome.oversized is not None
    )


def counters(*, status: str, reversibility: str, acted: bool) -> tuple[bool, str | None]:
    """The run list's counters a closed step moves: whether it counts as failed (the agent saw a failure),
    and which of `reversible_count`, `irreversible_count`, `unknown_count` it adds one to, if any."""
    failed = status in (ERROR, UNDELIVERED)
    if not acted:
        return failed, None
    return failed, {COMPENSATE: "reversible_count", NONE: "irreversible_count",
                    UNKNOWN: "unknown_count"}.get(reversibility)


def result_entry(
    step: Any,
    *,
    result: dict[str, Any] | None,
    outcome: Outcome,
    recovery: dict[str, Any] | None,
    links: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The chain's `result` entry for a closed step (any object with the step's fields as attributes). With
    `links` None it lacks `dependsOn`, which only the run's lock decides (the caller adds it then)."""
    then = getattr(step, "compensation_then", None)  # a recipe's further compensating calls
    effect = {
        "summary": step.effect_summary,
        "resource": step.effect_resource,
        "version": step.effect_version,
        # the changed fields' values before and after, as the server gave them (HATP's optional addition)
        **({"fields": fields} if (fields := getattr(step, "effect_fields", None)) else {}),
    }
    return {
        "step": step.number,
        "status": step.status,
        "isError": step.is_error,
        "result": result,
        **(
            {"resultSize": step.result_size, "resultSha256": step.result_sha256}
            if step.result_size is not None
            else {}
        ),
        **({"resultDropped": True} if outcome.oversized is not None else {}),
        "error": step.error_message or None,
        "failureClass": step.failure_class or None,
        **({"recovery": recovery} if recovery is not None else {}),
        "durationMs": round(step.duration_ms or 0, 3),
        "undo": {
            "kind": step.reversibility,
            "source": step.declaration_source,
            "compensationArguments": step.compensation_arguments,
            **({"compensationThen": then} if then else {}),
            "problems": step.undo_problems,
            "undoBy": format_ts(step.undo_by) if step.undo_by else None,
        },
        "effect": effect if step.effect_summary or step.effect_version else None,
        "receiptVerified": step.receipt_verified,
        **({"dependsOn": links} if links is not None else {}),
        # What an admin's recipe read just after the call (what the agent left), when it was kept.
        **({"readAfter": outcome.after_state} if outcome.after_state is not None else {}),
    }


def went_out(step) -> bool:
    """Whether a released held step's call reached its server: not when it was refused after its release
    (its record could no longer be read as the recipe needs) or the agent cancelled it before it was sent."""
    if step.failure_class == "policy":
        return False
    return not (step.status == "cancelled" and not step.may_have_acted)
