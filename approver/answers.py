"""Reading tool servers' answers under the undo contract (docs/design.md's UNDO_* codes), for checks and for
execution alike. Answers are untrusted input: only bounded strings of the fields we show get through."""

from typing import Any

from journal.undo.fields import field_values

TEXT = 500
CURRENT_FIELDS = ("version", "summary", "changedBy", "changedAt")


def bounded(value: Any) -> str:
    return value[:TEXT] if isinstance(value, str) else ""


def first_text(result: dict[str, Any]) -> str:
    """The first text block of a tool result, bounded."""
    for block in result.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "text":
            return bounded(block.get("text"))
    return ""


def structured(result: dict[str, Any]) -> dict[str, Any]:
    value = result.get("structuredContent")
    return value if isinstance(value, dict) else {}


def conflict_current(content: dict[str, Any]) -> dict[str, Any]:
    """An UNDO_CONFLICT's `current`: the record's version now, its summary, who changed it and when, and
    (HATP's optional addition) its field values now, as `fields`; `fieldsUnreadable` when the server sent
    field values that cannot be shown (nested, too many, not an object)."""
    current = content.get("current") if isinstance(content.get("current"), dict) else {}
    kept: dict[str, Any] = {key: bounded(current.get(key)) for key in CURRENT_FIELDS}
    if "fields" in current:
        fields = field_values(current["fields"])
        kept.update({"fields": fields} if fields is not None else {"fieldsUnreadable": True})
    return kept


def says_undone(result: dict[str, Any]) -> bool:
    """Whether a `hatp_check` answer says the undo has already happened: `"status": "undone"`
    (docs/design.md), or
    from servers written before that rule, UNDO_FAILED with the reason "already compensated"."""
    content = structured(result)
    if result.get("isError") is not True:
        return content.get("status") == "undone"
    return content.get("code") == "UNDO_FAILED" and content.get("reason") == "already compensated"
