"""Wire formats for moving run records between systems, validated strictly with pydantic.

- Our bundle (`export_run` / `import_run`): the chain entries, the signed checkpoints, and the public keys
  that verify them; later issues add approvals.
- A ChronoMCP audit log: JSON Lines of `{"ts", "kind", "tool"?, "data", "prevHash", "hash"}`, the first
  `prevHash` "GENESIS", each `hash` the SHA-256 hex of JavaScript's `JSON.stringify` of the entry without
  `hash`, keys in the order they appear. JSON.stringify is JCS without the key sort (RFC 8785 defines its
  strings and numbers by ECMAScript's), so the bytes are rebuilt with the JCS library's scalar encoding.
"""

import hashlib
import re
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import Refused
from ..undo.fields import field_change
from . import chain, strict_json

BUNDLE_FORMAT = "agent-undo/run-bundle@1"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# The one timestamp form of the chain (chain.format_ts).
_CHAIN_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def aware_moment(text: str | None) -> datetime | None:
    """An ISO 8601 moment with its offset, or ValueError naming what is wrong."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not an ISO 8601 date and time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{text[:60]!r} has no UTC offset")
    return moment


class WireEntry(_Wire):
    seq: int = Field(ge=1)
    ts: str = Field(max_length=40)
    event: str = Field(max_length=40)
    data: Any
    prevHash: str = Field(max_length=64)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("ts")
    @classmethod
    def _ts(cls, value: str) -> str:
        if not _CHAIN_TS.match(value):
            raise ValueError(f"{value[:40]!r} is not a chain timestamp (YYYY-MM-DDTHH:MM:SS.ffffffZ)")
        aware_moment(value.replace("Z", "+00:00"))
        return value

    @property
    def moment(self) -> datetime:
        return datetime.fromisoformat(self.ts.replace("Z", "+00:00"))


class WireCheckpoint(_Wire):
    run: str = Field(max_length=64)
    seq: int = Field(ge=1)
    headHash: str = Field(pattern=r"^[0-9a-f]{64}$")
    keyId: str = Field(max_length=40)
    signature: str = Field(max_length=200)


class WireKey(_Wire):
    keyId: str = Field(max_length=40)
    alg: Literal["Ed25519"]
    publicKey: str = Field(max_length=100)
    validFrom: str = Field(max_length=40)
    validUntil: str | None = Field(None, max_length=40)

    @field_validator("validFrom", "validUntil")
    @classmethod
    def _moment(cls, value: str | None) -> str | None:
        aware_moment(value)
        return value

    @property
    def window(self) -> tuple[datetime, datetime | None]:
        return aware_moment(self.validFrom), aware_moment(self.validUntil)


class WireRun(_Wire):
    id: str = Field(max_length=64)
    agent: str = Field(max_length=200)
    onBehalfOf: str | None = Field(None, max_length=200)
    startedAt: str = Field(max_length=40)
    recorder: str = Field(max_length=200)

    @field_validator("startedAt")
    @classmethod
    def _started(cls, value: str) -> str:
        aware_moment(value)
        return value

    @field_validator("recorder")
    @classmethod
    def _recorder(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or any(ord(c) < 33 for c in value):
            raise ValueError(f"{value[:80]!r} is not the URL of a Recorder (http or https)")
        return value


class BundleHead(_Wire):
    """A bundle's members but its entries, which are read one at a time (`read_entry`)."""

    format: Literal["agent-undo/run-bundle@1"]
    run: WireRun
    checkpoints: list[WireCheckpoint]
    publicKeys: list[WireKey]
    approvals: list[dict[str, Any]] = Field(default_factory=list)


class ImportRefused(Refused, ValueError):
    """A file that cannot be imported; the message names the bad field or entry."""


def describe_validation(error: ValidationError, *, line: int | None = None) -> str:
    first = error.errors(include_url=False, include_input=False)[0]
    location = ".".join(str(part) for part in first["loc"]) or "(root)"
    where = f"line {line}: " if line is not None else ""
    more = f" (and {error.error_count() - 1} more problems)" if error.error_count() > 1 else ""
    return f"{where}{location}: {first['msg']}{more}"


# A bundle wraps each tool call's arguments and result a few levels down (entries, entry, data, result).
BUNDLE_MAX_DEPTH = strict_json.MAX_DEPTH + 8


def read_head(members: dict[str, Any]) -> BundleHead:
    """A bundle's members but `entries`, validated strictly."""
    try:
        return BundleHead.model_validate(members)
    except ValidationError as exc:
        raise ImportRefused(describe_validation(exc)) from None


def read_entry(raw: Any, index: int) -> WireEntry:
    """The bundle's entry at `index` (from 0), validated strictly; the refusal names it as `entries.N`."""
    try:
        return WireEntry.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        location = ".".join(str(part) for part in ("entries", index, *first["loc"]))
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise ImportRefused(f"{location}: {first['msg']}{more}") from None


# -- ChronoMCP --------------------------------------------------------------------------------------------


class ChronoEntry(_Wire):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    ts: str = Field(max_length=40)
    kind: str = Field(max_length=60)
    tool: str | None = Field(None, max_length=200)
    data: dict[str, Any]
    prevHash: str = Field(max_length=64)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")


def js_stringify(value: Any) -> str:
    """JavaScript's JSON.stringify with no indentation: insertion-ordered keys, ECMAScript scalars."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{js_stringify(str(k))}:{js_stringify(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(js_stringify(v) for v in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        value = float(value)  # JSON.parse read it as a double; stringify prints that double
    return rfc8785.dumps(value).decode("utf-8")


def parse_chronomcp_log(text: str) -> list[tuple[dict[str, Any], ChronoEntry]]:
    """Parse and verify a ChronoMCP audit log; refuse it whole, naming the first bad line."""
    entries = []
    expected_prev = chain.GENESIS
    # split("\n"), not splitlines(): JSON.stringify leaves U+2028 and U+2029 raw inside strings.
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        raise ImportRefused("the audit log is empty")
    for number, line in enumerate(lines, start=1):
        try:
            raw = strict_json.loads(
                line, max_bytes=len(line) * 4, max_depth=BUNDLE_MAX_DEPTH, what="the line"
            )
        except strict_json.JsonRefused as exc:
            raise ImportRefused(f"line {number}: {exc}") from None
        if not isinstance(raw, dict):
            raise ImportRefused(f"line {number}: not a JSON object")
        try:
            entry = ChronoEntry.model_validate(raw)
        except ValidationError as exc:
            raise ImportRefused(describe_validation(exc, line=number)) from None
        if entry.prevHash != expected_prev:
            raise ImportRefused(f"line {number}: prevHash does not match the previous entry's hash")
        payload = {key: value for key, value in raw.items() if key != "hash"}
        try:
            recomputed = hashlib.sha256(js_stringify(payload).encode("utf-8")).hexdigest()
        except (rfc8785.CanonicalizationError, ValueError) as exc:
            raise ImportRefused(f"line {number}: cannot serialise ({exc})") from None
        if recomputed != entry.hash:
            raise ImportRefused(f"line {number}: content does not match its hash")
        expected_prev = entry.hash
        entries.append((raw, entry))
    return entries


# The reversibility a step may take from an imported record (journal.models.Step.Reversibility).
REVERSIBILITY = ("compensate", "none", "unknown", "read_only")


def parse_ts(text: str, fallback: datetime | None) -> datetime | None:
    """An imported timestamp, or `fallback` when it is not an aware ISO 8601 moment."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return fallback
    return moment if moment.tzinfo else fallback


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any, limit: int) -> str:
    return str(value or "")[:limit]


def _called(data: dict[str, Any], at: datetime | None) -> dict[str, Any]:
    """A step's columns from its `call` entry."""
    arguments = data.get("arguments")
    held = _dict(data.get("policy")).get("decision") == "ask"
    return {
        "number": data["step"],
        "server_name": str(data.get("server", ""))[:60],
        "tool": str(data.get("tool", ""))[:200],
        "arguments": arguments if isinstance(arguments, dict) else {},
        "started_at": at,
        "status": "held" if held else "pending",
    }


def _answered(data: dict[str, Any], at: datetime | None) -> dict[str, Any]:
    """A step's columns from its `result` entry; what is not of the right type keeps the column's default."""
    undo, effect = _dict(data.get("undo")), _dict(data.get("effect"))
    fields = _dict(effect.get("fields"))
    kind, problems, verified = undo.get("kind"), undo.get("problems"), data.get("receiptVerified")
    compensation = undo.get("compensationArguments")
    return {
        "status": data.get("status") if data.get("status") in ("error", "undelivered", "cancelled") else "ok",
        "is_error": data.get("isError") is True,
        "result": data.get("result") if isinstance(data.get("result"), dict) else None,
        "failure_class": _text(data.get("failureClass"), 20),
        "finished_at": at,
        "reversibility": kind if kind in REVERSIBILITY else "unknown",
        "declaration_source": _text(undo.get("source"), 40),
        "compensation_arguments": compensation if isinstance(compensation, dict) else None,
        "compensation_then": then if isinstance(then := undo.get("compensationThen"), list) else None,
        "undo_problems": [str(p) for p in problems] if isinstance(problems, list) else [],
        "undo_by": parse_ts(undo.get("undoBy") or "", None) if undo.get("undoBy") else None,
        "effect_summary": _text(effect.get("summary"), 500),
        "effect_resource": _text(effect.get("resource"), 500),
        "effect_version": _text(effect.get("version"), 200),
        "effect_fields": field_change(fields.get("before"), fields.get("after"),
                                      unreadable=fields.get("unreadable") is True),
        "receipt_verified": verified if isinstance(verified, bool) else None,
    }


class StepBuilder:
    """The step rows of an imported run, rebuilt from its call and result events as they are read: each
    row's column values. A step is finished once its result is in (nothing later in a record changes it), so
    only the calls still waiting for theirs are held, with the numbers of those finished. Anything the record
    does not say keeps the column's default."""

    def __init__(self, *, started_at: datetime) -> None:
        self._started_at = started_at
        self._open: dict[int, dict[str, Any]] = {}
        self._done: set[int] = set()
        self.finished: list[dict[str, Any]] = []

    def add(self, entry: dict[str, Any]) -> None:
        data = _dict(entry["data"])
        number = data.get("step")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1 or number in self._done:
            return
        event, steps = entry["event"], self._open
        if event == "call" and number not in steps:
            steps[number] = _called(data, parse_ts(entry["ts"], self._started_at))
        elif event == "released" and number in steps and steps[number]["status"] == "held":
            steps[number]["status"] = "pending"
        elif event == "result" and number in steps:
            step = steps.pop(number)
            step.update(_answered(data, parse_ts(entry["ts"], self._started_at)))
            if "readAfter" in data and isinstance(step.get("earlier_state"), dict):
                step["earlier_state"]["left"] = data["readAfter"]
            self._done.add(number)
            self.finished.append(step)
        elif event == "earlier_state" and number in steps:  # an admin's recipe read the record
            steps[number]["earlier_state"] = {k: v for k, v in data.items() if k != "step"}

    def take(self) -> list[dict[str, Any]]:
        """The steps finished since the last `take`."""
        finished, self.finished = self.finished, []
        return finished

    def unfinished(self) -> list[dict[str, Any]]:
        """The steps whose result never came (held, or in flight when the record was exported), in order."""
        return [self._open[n] for n in sorted(self._open)]


def step_fields(entries: list[dict[str, Any]], *, started_at: datetime) -> list[dict[str, Any]]:
    """The step rows of a whole record, in step order (see `StepBuilder`)."""
    builder = StepBuilder(started_at=started_at)
    for entry in entries:
        builder.add(entry)
    return sorted(builder.take() + builder.unfinished(), key=lambda fields: fields["number"])
