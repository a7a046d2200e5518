"""Undo declarations: three dialects in, one model out (docs/design.md, "Undo declarations").

Precedence: per-call journal `_meta` > tool-level `hatp/journal` > `dev.chronomcp/compensate` >
`annotations.recovery` > nothing. `readOnlyHint` counts only when no other source speaks. Nothing declared
is `unknown`, never safe.

Declarations come from servers that may be wrong or hostile, so the first source that is present decides,
and if it is malformed the answer is `unknown` with the problem spelled out: a broken high-precedence
declaration never silently falls through to a more permissive one below it.
"""

import re
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
)

Kind = Literal["compensate", "none", "unknown", "read_only"]
Source = Literal[
    "hatp/journal (call)",
    "hatp/journal (tool)",
    "dev.chronomcp/compensate",
    "annotations.recovery",
    "annotations.readOnlyHint",
    "annotations.reversibility",
    "recipe",
    "database",
    "none",
]
# SEP-2793 (open): tool risk metadata in the annotations, read as a hint below the three dialects.
RISK_HINT = "annotations.reversibility"
Dialect = Literal["hatp", "sep3172", "chronomcp", "recipe", "database"]

HATP_KEY = "hatp/journal"
CHRONO_KEY = "dev.chronomcp/compensate"
HATP_CHECK = "hatp_check"
HATP_COMPENSATE = "hatp_compensate"
# The problem a compensable call without a reported version has: it may still be undone, but only with a
# human deciding, since a later change to the record could not be detected (docs/design.md).
NO_VERSION_PROBLEM = "no version was reported, so a later change could not be detected: a human must decide"
HIDDEN_TOOLS = frozenset({HATP_CHECK, HATP_COMPENSATE})

_TEXT = 500  # longest server-written sentence we keep; longer is treated as hostile, not truncated
_DURATION = re.compile(
    r"^P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$"
)


def parse_duration(text: str) -> timedelta:
    """ISO 8601 durations in weeks, days, hours, minutes and seconds. Years and months are refused:
    their length depends on the calendar, and an undo deadline must not."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match or text in {"P", "PT"} or text.endswith("T"):
        raise ValueError(
            f"{text!r} is not an ISO 8601 duration like P7D or PT12H (years and months are not accepted)"
        )
    parts = {k: int(v) for k, v in match.groupdict().items() if v}
    return timedelta(
        weeks=parts.get("w", 0), days=parts.get("d", 0), hours=parts.get("h", 0),
        minutes=parts.get("m", 0), seconds=parts.get("s", 0),
    )


def _valid_window(value: str | None) -> str | None:
    if value is not None:
        parse_duration(value)
    return value


# An undo window, as a declaration or a recipe gives it: an ISO 8601 duration.
Window = Annotated[str | None, AfterValidator(_valid_window)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, populate_by_name=True)


class Cost(_Strict):
    amount: str = Field(max_length=32)
    currency: str = Field(pattern=r"^[A-Z]{3}$")

    @field_validator("amount")
    @classmethod
    def _decimal(cls, value: str) -> str:
        try:
            number = Decimal(value)
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a decimal amount") from None
        if not number.is_finite() or number < 0:
            raise ValueError(f"{value!r} is not a non-negative amount")
        return value


class HatpUndo(_Strict):
    kind: Literal["compensate", "none", "unknown"]
    window: Window = None
    via: Literal["api", "ui"] | None = None
    side_effect: str | None = Field(None, alias="sideEffect", max_length=_TEXT)
    cost: Cost | None = None
    reason: str | None = Field(None, max_length=_TEXT)
    remedy: str | None = Field(None, max_length=_TEXT)
    undo_by: str | None = Field(None, alias="undoBy", max_length=64)

    @field_validator("undo_by")
    @classmethod
    def _undo_by(cls, value: str | None) -> str | None:
        if value is not None:
            moment = datetime.fromisoformat(value)
            if moment.tzinfo is None:
                raise ValueError(f"undoBy {value!r} has no time zone")
        return value


class Fingerprint(_Strict):
    """What a `via: "ui"` version fingerprints: the screen the changed record shows on and its visible fields
    (the HATP draft: the changed record only, never the whole screen). Shown to the approver as it came."""

    screen: str = Field(max_length=200)
    fields: dict[str, str | int | float | bool | None] = Field(max_length=40)

    @field_validator("fields")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, shown in value.items():
            if len(name) > 100 or (isinstance(shown, str) and len(shown) > _TEXT):
                raise ValueError("a fingerprint field is too long to show")
        return value


class Effect(_Strict):
    summary: str | None = Field(None, max_length=_TEXT)
    resource: str | None = Field(None, max_length=_TEXT)
    version: str | None = Field(None, max_length=200)
    fingerprint: Fingerprint | None = None
    # The changed fields' values before and after the call (optional): read by `journal.undo.fields`, so a bad
    # one is dropped and said to be, never making the rest of the journal unreadable.
    before: Any = None
    after: Any = None

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        # Versions are opaque; an integer version is common and harmless, so keep it as its string.
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class Receipt(_Strict):
    key_id: str = Field(alias="keyId", max_length=200)
    alg: Literal["Ed25519"]
    signature: str = Field(max_length=200)


class CallJournal(_Strict):
    """`result._meta["hatp/journal"]` of one call."""

    undo: HatpUndo | None = None
    compensation_token: str | None = Field(None, alias="compensationToken", max_length=500)
    effect: Effect | None = None
    receipt: Receipt | None = None


class ChronoCompensation(_Strict):
    tool_name: str = Field(alias="toolName", max_length=200)
    parameter_mapping: dict[str, str] = Field(alias="parameterMapping")
    timeout_ms: int | None = Field(None, alias="timeoutMs", ge=0)
    max_retries: int | None = Field(None, alias="maxRetries", ge=0, le=100)


class ChronoDeclaration(_Strict):
    reversibility: Literal["readonly", "compensable", "irreversible"]
    compensation: ChronoCompensation | None = None
    side_effect_scope: list[str] = Field(default_factory=list, alias="sideEffectScope")
    notes: str | None = Field(None, max_length=_TEXT)


class SepOperation(_Strict):
    operation_id: str = Field(alias="operationId", max_length=200)
    parameters: dict[str, Any] = Field(default_factory=dict)


class SepRecovery(_Strict):
    strategy: str = Field(max_length=100)
    compensating_operation: SepOperation | None = Field(None, alias="compensatingOperation")


class Compensation(BaseModel):
    model_config = ConfigDict(frozen=True)

    tool: str
    dialect: Dialect
    # Parameter name -> binding expression (SEP-3172 runtime expression or ChronoMCP path). Empty for HATP,
    # whose compensation takes the call's compensation token.
    bindings: dict[str, Any] = Field(default_factory=dict)
    timeout_ms: int | None = None
    max_retries: int | None = None
    # A recipe's further calls, in order, after the first ({"tool", "bindings"} each: re-creating deleted
    # entities, then the relations the delete took with them). Kept in the record only when there are any.
    then: tuple[dict[str, Any], ...] = Field((), exclude=True)
    # A recipe whose read of the record took a version just before the call: its undo is checked against
    # versions like a HATP one (the record read again), so the policies class it as such. Never stored.
    versioned: bool = Field(False, exclude=True)

    @model_serializer(mode="wrap")
    def _with_then(self, handler):
        data = handler(self)
        if self.then:
            data["then"] = [dict(call) for call in self.then]
        return data


class UndoDeclaration(BaseModel):
    """What a call says about its own undo, whichever dialect said it."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    source: Source
    via: Literal["api", "ui"] | None = None
    window: str | None = None
    undo_by: str | None = None
    side_effect: str | None = None
    cost: Cost | None = None
    reason: str | None = None
    remedy: str | None = None
    compensation: Compensation | None = None
    problems: tuple[str, ...] = ()
    # A person must sign this undo whatever the policies say (an admin's recipe, by default). Kept in the
    # step's record only when set, so every declaration written before recipes reads as it did.
    needs_human: bool = Field(False, exclude=True)

    @model_serializer(mode="wrap")
    def _with_needs_human(self, handler):
        data = handler(self)
        if self.needs_human:
            data["needs_human"] = True
        return data

    def deadline(self, completed_at: datetime) -> datetime | None:
        """When the undo window closes: the call's own `undoBy`, else completion time plus the window."""
        if self.kind != "compensate":
            return None
        if self.undo_by:
            return datetime.fromisoformat(self.undo_by)
        if self.window:
            return completed_at + parse_duration(self.window)
        return None


def _problem_text(where: str, error: ValidationError) -> list[str]:
    problems = []
    for detail in error.errors(include_url=False, include_input=False):
        location = ".".join(str(part) for part in detail["loc"]) or "(root)"
        problems.append(f"{where}: {location}: {detail['msg']}")
    return problems


def _unknown(source: Source, problems: list[str]) -> UndoDeclaration:
    return UndoDeclaration(kind="unknown", source=source, problems=tuple(problems))


def _from_hatp(undo: dict[str, Any], source: Source, catalogue: Collection[str]) -> UndoDeclaration:
    parsed = HatpUndo.model_validate(undo)
    compensation = None
    problems: list[str] = []
    if parsed.kind == "compensate":
        # Through the API, or through the app's own screens (`via: "ui"`): either way the server replays it,
        # behind `hatp_compensate`; a UI undo always needs a person's signature (approver.policy).
        if HATP_COMPENSATE not in catalogue:
            problems.append(f"the server declares a compensation but does not offer {HATP_COMPENSATE}"
                            + (" to replay it through its screens" if parsed.via == "ui" else ""))
        else:
            compensation = Compensation(tool=HATP_COMPENSATE, dialect="hatp")
    return UndoDeclaration(
        kind=parsed.kind,
        source=source,
        via=parsed.via or ("api" if parsed.kind == "compensate" else None),
        window=parsed.window,
        undo_by=parsed.undo_by,
        side_effect=parsed.side_effect,
        cost=parsed.cost,
        reason=parsed.reason,
        remedy=parsed.remedy,
        compensation=compensation,
        problems=tuple(problems),
    )


def _from_chronomcp(raw: Any, catalogue: Collection[str]) -> UndoDeclaration:
    source: Source = "dev.chronomcp/compensate"
    parsed = ChronoDeclaration.model_validate(raw)
    side_effect = ", ".join(parsed.side_effect_scope) or None
    if parsed.reversibility == "readonly":
        return UndoDeclaration(kind="read_only", source=source)
    if parsed.reversibility == "irreversible":
        return UndoDeclaration(kind="none", source=source, reason=parsed.notes, side_effect=side_effect)
    if parsed.compensation is None:
        return _unknown(source, ["compensable, but no compensation is given"])
    tool = parsed.compensation.tool_name
    if tool not in catalogue or tool in HIDDEN_TOOLS:
        return _unknown(source, [f"the compensating tool {tool!r} is not a tool of this server"])
    return UndoDeclaration(
        kind="compensate",
        source=source,
        via="api",
        side_effect=side_effect,
        reason=parsed.notes,
        compensation=Compensation(
            tool=tool,
            dialect="chronomcp",
            bindings=dict(parsed.compensation.parameter_mapping),
            timeout_ms=parsed.compensation.timeout_ms,
            max_retries=parsed.compensation.max_retries,
        ),
    )


def _from_sep3172(raw: Any, catalogue: Collection[str]) -> UndoDeclaration:
    source: Source = "annotations.recovery"
    parsed = SepRecovery.model_validate(raw)
    if parsed.strategy != "compensation":
        return _unknown(source, [f"unknown recovery strategy {parsed.strategy!r}"])
    if parsed.compensating_operation is None:
        return _unknown(source, ["strategy is compensation, but no compensatingOperation is given"])
    tool = parsed.compensating_operation.operation_id
    if tool not in catalogue or tool in HIDDEN_TOOLS:
        return _unknown(source, [f"the compensating operation {tool!r} is not a tool of this server"])
    return UndoDeclaration(
        kind="compensate",
        source=source,
        via="api",
        compensation=Compensation(
            tool=tool, dialect="sep3172", bindings=dict(parsed.compensating_operation.parameters)
        ),
    )


def normalise(
    tool: Mapping[str, Any],
    *,
    catalogue: Collection[str],
    call_journal: Any = None,
) -> UndoDeclaration:
    """Read a tool's raw `tools/list` entry (and, after a call, its result's `_meta["hatp/journal"]`).

    `catalogue` is the set of tool names the same server currently offers: a compensation must be one of them.
    """
    meta = tool.get("_meta") if isinstance(tool.get("_meta"), Mapping) else {}
    annotations = tool.get("annotations") if isinstance(tool.get("annotations"), Mapping) else {}
    tool_hatp = meta.get(HATP_KEY)

    call_undo = call_journal.get("undo") if isinstance(call_journal, Mapping) else None
    if call_undo is not None:
        # Fields the call leaves out (a side effect, say) are taken from the tool's own declaration.
        base = (
            tool_hatp.get("undo")
            if isinstance(tool_hatp, Mapping) and isinstance(tool_hatp.get("undo"), Mapping)
            else {}
        )
        source: Source = "hatp/journal (call)"
        if not isinstance(call_undo, Mapping):
            return _unknown(source, ["undo is not an object"])
        try:
            return _from_hatp({**base, **call_undo}, source, catalogue)
        except ValidationError as exc:
            return _unknown(source, _problem_text("undo", exc))

    if tool_hatp is not None:
        source = "hatp/journal (tool)"
        undo = tool_hatp.get("undo") if isinstance(tool_hatp, Mapping) else None
        if not isinstance(undo, Mapping):
            return _unknown(source, ["hatp/journal has no undo object"])
        try:
            return _from_hatp(dict(undo), source, catalogue)
        except ValidationError as exc:
            return _unknown(source, _problem_text("undo", exc))

    if CHRONO_KEY in meta:
        try:
            return _from_chronomcp(meta[CHRONO_KEY], catalogue)
        except ValidationError as exc:
            return _unknown("dev.chronomcp/compensate", _problem_text(CHRONO_KEY, exc))

    if "recovery" in annotations:
        try:
            return _from_sep3172(annotations["recovery"], catalogue)
        except ValidationError as exc:
            return _unknown("annotations.recovery", _problem_text("recovery", exc))

    if annotations.get("readOnlyHint") is True:
        return UndoDeclaration(kind="read_only", source="annotations.readOnlyHint")
    return _from_risk_hints(annotations) or UndoDeclaration(kind="unknown", source="none")


def _from_risk_hints(annotations: Mapping[str, Any]) -> UndoDeclaration | None:
    """SEP-2793's `reversibility` hint (`auto`, `manual`, `none`), with its `sideEffects`, `riskLevel` and
    `approvalRecommendation` in words. A hint, not a declaration: "none" and "manual" say the call cannot
    be undone for you; "auto" says it can, but with no compensation declared there is nothing to undo it
    with, so its undo stays unknown."""
    hint = annotations.get("reversibility")
    if hint not in ("auto", "manual", "none"):
        return None
    effects = annotations.get("sideEffects")
    side_effect = "; ".join(str(e)[:100] for e in effects[:10] if isinstance(e, str)) \
        if isinstance(effects, list) else None
    also = [f"{name} {annotations[key]}" for key, name in (("riskLevel", "risk level"),
                                                          ("approvalRecommendation", "approval recommended:"))
            if isinstance(annotations.get(key), str) and len(annotations[key]) <= 20]
    said = f"its server hints reversibility: {hint} (SEP-2793){'; ' + ', '.join(also) if also else ''}"
    if hint == "auto":
        return UndoDeclaration(kind="unknown", source=RISK_HINT, side_effect=side_effect or None, problems=(
            f"{said}, but declares no compensation to undo it with",))
    remedy = "Undo it by hand, as the server's documentation says." if hint == "manual" else None
    return UndoDeclaration(kind="none", source=RISK_HINT, side_effect=side_effect or None, remedy=remedy,
                           reason=f"{said[0].upper()}{said[1:]}: it cannot be undone for you.")


def parse_call_journal(raw: Any) -> tuple[CallJournal | None, list[str]]:
    """The per-call journal of a result, or the reasons it could not be read."""
    if raw is None:
        return None, []
    try:
        return CallJournal.model_validate(raw), []
    except ValidationError as exc:
        return None, _problem_text(HATP_KEY, exc)
