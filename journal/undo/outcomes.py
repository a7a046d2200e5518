"""What a tool server's answer says, as pure functions: the undo facts of a result, whether its receipt
verifies, and which failure class an `isError` result belongs to.

No ORM and no clock: the writer (`journal.services.steps.close_step`) passes in the server's catalogue
entry, its pinned receipt keys and the moment the answer came back. A server's answer is untrusted input.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..record import chain
from ..record.canonical import ijson_problem, to_ijson
from . import declarations, recipes
from .bindings import BindingError, NothingToUndo, resolve_arguments
from .fields import field_change

# The MCP-Rescue failure class of an `isError` result's structured code.
_CLASS_BY_CODE = {
    "UNDO_CONFLICT": "conflict", "CONFLICT": "conflict", "UNDO_EXPIRED": "business_rule",
    "UNDO_UNKNOWN_TOKEN": "not_found", "NOT_FOUND": "not_found", "UNDO_FAILED": "business_rule",
    "INVALID_ARGUMENTS": "invalid_arguments", "UNAUTHENTICATED": "authentication",
    "PERMISSION_DENIED": "permission", "FORBIDDEN": "permission", "UNAVAILABLE": "transient",
    "RATE_LIMITED": "transient", "BUSINESS_RULE": "business_rule",
}
# Without a code, the server's own words, read in this order.
_CLASS_BY_WORDS = (
    # First: "unavailable on this protocol" is no passing outage.
    (("protocol version", "this protocol", "unsupported protocol", "not supported by the client",
      "client capabilit", "did not declare"), "unsupported"),
    (("timed out", "timeout", "temporarily", "unavailable", "try again", "rate limit"), "transient"),
    (("unauthori", "unauthenticated", "invalid token", "not authenticated"), "authentication"),
    (("permission", "forbidden", "not allowed", "access denied"), "permission"),
    (("not found", "no such", "does not exist", "unknown"), "not_found"),
    (("conflict", "version mismatch", "was modified", "changed since"), "conflict"),
    (("invalid", "validation", "required", "must be", "expected"), "invalid_arguments"),
)


def classify_tool_error(result: Mapping[str, Any]) -> str:
    """A best reading of an `isError` result: structured codes first, then the server's words."""
    structured = result.get("structuredContent")
    code = structured.get("code") if isinstance(structured, Mapping) else None
    if isinstance(code, str) and code.upper() in _CLASS_BY_CODE:
        return _CLASS_BY_CODE[code.upper()]
    text = " ".join(
        block.get("text", "") for block in result.get("content") or [] if isinstance(block, Mapping)
    ).lower()
    for needles, failure_class in _CLASS_BY_WORDS:
        if any(needle in text for needle in needles):
            return failure_class
    return "business_rule" if text else "unknown"


def _effect(parsed, declaration: declarations.UndoDeclaration, *, earlier: Any, after_version: str,
            problems: list[str]) -> declarations.Effect:
    """What the call changed, as its server says; for a recipe's call, its version is the recipe's read of
    the record just after the call (what the agent left), and a call that left it as it was has nothing to
    undo."""
    effect = parsed.effect if parsed and parsed.effect else declarations.Effect()
    if declaration.source == recipes.SOURCE and after_version and not effect.version:
        effect = effect.model_copy(update={"version": after_version})
        if (earlier or {}).get("version") == after_version and declaration.kind == "compensate":
            problems.append("nothing to undo: the call left the record as it found it")
    return effect


def _compensation_arguments(spec: declarations.Compensation, *, token: str | None,
                            arguments: dict[str, Any], result: dict[str, Any], before: Any,
                            problems: list[str]) -> dict[str, Any] | None:
    """The compensation's arguments, resolved now from the call (and the earlier state a recipe read), or
    None with the reason added to `problems`: never partial arguments."""
    if spec.dialect == "hatp":
        if not token:
            problems.append("the server declared a compensation but returned no compensation token")
            return None
        return {"compensationToken": token}
    response = result.get("structuredContent") if spec.dialect != "chronomcp" else result
    try:
        return resolve_arguments(spec.bindings, dialect=spec.dialect, request=arguments, response=response,
                                 before=before)
    except NothingToUndo as exc:
        problems.append(f"nothing to undo: {exc}")
    except BindingError as exc:
        problems.append(f"a binding does not resolve: {exc}")
    return None


def _inexact(arguments: dict[str, Any], then: list[dict[str, Any]] | None) -> str | None:
    """Why the record would not keep an undo's arguments as they were bound (a U+0000 or a big integer the
    server sent), or None."""
    return ijson_problem(arguments) or ijson_problem([call["arguments"] for call in then or []])


def _further_calls(spec: declarations.Compensation, *, arguments: dict[str, Any], result: dict[str, Any],
                   before: Any, problems: list[str]) -> list[dict[str, Any]] | None:
    """A recipe's further compensating calls, each resolved like the first, or None with the reason added
    to `problems` (the whole undo is then not prepared: never some of its calls). A call with nothing to do
    (an empty `*` array: the entities had no relations) is left out."""
    calls = []
    for call in spec.then:
        try:
            resolved = resolve_arguments(call["bindings"], dialect=spec.dialect, request=arguments,
                                         response=result.get("structuredContent"), before=before)
        except NothingToUndo:
            continue
        except BindingError as exc:
            problems.append(f"a binding of its call {call['tool']} does not resolve: {exc}")
            return None
        if not all(value == [] for value in resolved.values()):
            calls.append({"tool": call["tool"], "arguments": resolved})
    return calls


def receipt_check(receipt_keys: Mapping[str, str], journal_raw: Any, parsed) -> tuple[bool | None, str]:
    """Whether the call's receipt verifies against the server's pinned key: (None, "") when it sent none."""
    if parsed is None or parsed.receipt is None:
        return None, ""
    public = receipt_keys.get(parsed.receipt.key_id)
    if public is None:
        return False, f"unknown receipt key {parsed.receipt.key_id}"
    body = {k: v for k, v in journal_raw.items() if k != "receipt"}
    try:
        ok = chain.signature_valid(
            chain.public_key_from_text(public), to_ijson(body), parsed.receipt.signature
        )
    except ValueError:
        ok = False
    return ok, "" if ok else "the receipt's signature does not verify"


def undo_facts(*, tool_def: dict[str, Any] | None, catalogue: set[str], receipt_keys: Mapping[str, str],
               arguments: dict[str, Any], result: dict[str, Any], finished: datetime,
               recipe: dict[str, Any] | None = None, listing: Any = (), earlier: Any = None,
               after_version: str = "") -> dict[str, Any]:
    """Everything a successful result says about undoing its call, read through the declaration rules (and
    an admin's recipe, with the earlier state it read: `recipes`), as the step's column values."""
    meta = result.get("_meta") if isinstance(result.get("_meta"), dict) else {}
    journal_raw = meta.get(declarations.HATP_KEY)
    parsed, problems = declarations.parse_call_journal(journal_raw)
    declaration = recipes.declaration_for(
        tool_def, catalogue=catalogue, call_journal=journal_raw if parsed is not None else None,
        recipe=recipe, listing=listing, earlier=earlier)
    problems = [*problems, *declaration.problems]
    effect = _effect(parsed, declaration, earlier=earlier, after_version=after_version, problems=problems)
    token = parsed.compensation_token if parsed else None
    compensation_arguments, then = None, None
    if declaration.kind == "compensate" and declaration.compensation is not None:
        before = (earlier or {}).get("structured")
        compensation_arguments = _compensation_arguments(
            declaration.compensation, token=token, arguments=arguments, result=result, before=before,
            problems=problems)
        if declaration.compensation.then and compensation_arguments is not None:
            then = _further_calls(declaration.compensation, arguments=arguments, result=result, before=before,
                                  problems=problems)
            compensation_arguments = compensation_arguments if then is not None else None
        if compensation_arguments is not None and (inexact := _inexact(compensation_arguments, then)):
            problems.append(f"the undo's arguments cannot be kept exactly ({inexact}): an undo sent from the "
                            "record would not be the one this call needs")
            compensation_arguments = then = None
        if not effect.version:
            problems.append(declarations.NO_VERSION_PROBLEM)
    verified, receipt_problem = receipt_check(receipt_keys, journal_raw, parsed)
    return {
        "declaration": declaration.model_dump(mode="json"),
        "declaration_source": declaration.source,
        "reversibility": declaration.kind,
        "compensation_arguments": compensation_arguments,
        "compensation_then": then,
        "undo_problems": problems,
        "effect_summary": effect.summary or "",
        "effect_resource": effect.resource or "",
        "effect_version": effect.version or "",
        "effect_fingerprint": effect.fingerprint.model_dump(mode="json") if effect.fingerprint else None,
        "effect_fields": field_change(effect.before, effect.after),
        "compensation_token": token or "",
        "undo_by": declaration.deadline(finished),
        "receipt": journal_raw.get("receipt") if isinstance(journal_raw, dict) else None,
        "receipt_verified": verified,
        "receipt_problem": receipt_problem,
    }
