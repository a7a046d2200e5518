"""A record's field values as a tool server gives them (HATP's optional `effect.before`/`after` and
`UNDO_CONFLICT.current.fields`), kept only as plain, bounded values to show a conflict field by field. No ORM
and no clock."""

import math
from typing import Any

_TEXT = 500  # characters of one value kept

FIELDS_SHOWN = 40  # at most this many fields of a record are kept to show


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
