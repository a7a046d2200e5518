"""A record's field values as a tool server gives them (HATP's optional `effect.before`/`after` and
`UNDO_CONFLICT.current.fields`), kept only as plain, bounded values to show a conflict field by field. No ORM
and no clock."""

import math
from typing import Any

_TEXT = 500  # characters of one value kept

FIELDS_SHOWN = 40  # at most this many fields of a record are kept to show
NOT_KEPT = "(not kept)"  # a three-way row's state that was not kept (what the agent left, for some recipes)
NOT_GIVEN = "(not given)"  # a field a server gave no value for, in one of the three states


def field_values(raw: Any) -> dict[str, str | int | float | bool | None] | None:
    """A record's field values as a server gave them (an effect's `before`/`after`, a conflict's
    `current.fields`): an object of at most FIELDS_SHOWN short names to plain values, strings bounded; None
    for anything else (a server that sends no usable field values gets what it gave without them)."""
    if not isinstance(raw, dict) or len(raw) > FIELDS_SHOWN:
        return None
    kept = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not 0 < len(name) <= 100:
            return None
        if isinstance(value, float) and not math.isfinite(value) or isinstance(value, (dict, list)):
            return None  # NaN, an infinity (not I-JSON) or a nested value: not a field value to show
        if isinstance(value, str) and len(value) > _TEXT:
            value = value[:_TEXT] + "…"
        kept[name] = value
    return kept


def field_change(before: Any, after: Any, *, unreadable: bool = False) -> dict[str, Any] | None:
    """A call's changed fields as kept on its step (`Step.effect_fields`), from the values a server gave (or
    an imported record kept): `{"before", "after"}`, each `field_values` or None, with `"unreadable": True`
    when one was given but cannot be shown; None when there is nothing to say."""
    kept = field_values(before), field_values(after)
    unreadable = unreadable or any(raw is not None and value is None
                                   for raw, value in zip((before, after), kept, strict=True))
    if kept == (None, None) and not unreadable:
        return None
    return {"before": kept[0], "after": kept[1], **({"unreadable": True} if unreadable else {})}


def marks(row: dict[str, Any]) -> dict[str, bool]:
    """Which cells of a three-way row (`recipe_text`'s `{"before", "left", "now"}`) changed: `agent`, what
    the agent left differs from before it; `since`, what is there now differs from what it left. A state not
    kept or not given marks nothing it is compared with."""
    unknown = {NOT_KEPT, NOT_GIVEN}
    left, now = row.get("left"), row.get("now")
    return {"agent": left not in unknown and left != row.get("before"),
            "since": now not in unknown and left != NOT_GIVEN and now != left}
