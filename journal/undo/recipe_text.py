"""What a recipe's undo looks like to the people who write and sign it. No ORM and no clock.

- `brief`: a compensation's arguments in one line (`write_file {path: "notes.txt", content: 1.2 kB}`), for
  the preview an admin sees when writing a recipe;
- `three_way`: a conflict shown three ways (before the agent, what the agent left, what is there now): a
  line diff for text (a file's content), a field diff for records (a knowledge graph's entities), bounded;
  `field_changes` the same for a HATP server's field values, and `after_the_agent` when, after the agent's
  change, a record changed again ("12 minutes after the agent's change").
"""

import difflib
import json
import os
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from .fields import NOT_GIVEN, NOT_KEPT

_SHORT = 160  # a one-line string up to this long is shown as it is; a longer one (or text) by its size
_DIFF_LINES = 80  # lines of a text diff shown, each way
_FIELDS = 40  # fields of a record diff shown
_VALUE = 200  # characters of one field's value shown


def size(text: str) -> str:
    """A string's size in words: "120 B", "1.2 kB", "3.4 MB"."""
    n = len(text.encode("utf-8"))
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def _value(value: Any) -> str:
    if isinstance(value, str):
        one_line = len(value) <= _SHORT and "\n" not in value
        return json.dumps(value, ensure_ascii=False) if one_line else size(value)
    if isinstance(value, list):
        inner = json.dumps(value, ensure_ascii=False)
        return inner if len(inner) <= _SHORT // 2 else f"[{len(value)} item{'s' if len(value) != 1 else ''}]"
    if isinstance(value, Mapping):
        inner = json.dumps(value, ensure_ascii=False)
        return inner if len(inner) <= _SHORT // 2 else "{" + ", ".join(str(k) for k in list(value)[:6]) + "…}"
    return json.dumps(value)


def brief(tool: str, arguments: Mapping[str, Any]) -> str:
    """One call in one line: long strings by their size, long lists by their length."""
    return f"{tool} {{{', '.join(f'{name}: {_value(value)}' for name, value in arguments.items())}}}"


# -- a conflict, three ways ---------------------------------------------------------------------------------


def record_name(resource: str) -> str:
    """A record as people name it: "crm://acme/deal/D-881" reads "deal D-881"; a path, or a recipe's read
    naming one (`read_text_file {path: "/srv/globex-brief.md"}`), its file's name; an entity read by name
    (`open_nodes {names: ["Dana"]}`), the name."""
    if not resource:
        return ""
    read = re.fullmatch(r"[\w.-]+ (\{.*\})", resource, re.S)
    if read:
        try:
            values = _strings(json.loads(read.group(1)))
        except ValueError:  # `brief`'s form: the quoted values after each name
            values = re.findall(r'"((?:[^"\\]|\\.)*)"(?!\s*:)', read.group(1))
        return ", ".join(v.rstrip("/").rsplit("/", 1)[-1] for v in values) or resource
    parts = [p for p in urlsplit(resource).path.split("/") if p]
    if "://" in resource and len(parts) >= 2 and parts[-2].isalpha():
        return f"{parts[-2]} {parts[-1]}"
    return parts[-1] if parts else resource


def _strings(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return [value] if isinstance(value, str) else []


def recipe_title(earlier: Mapping[str, Any] | None) -> str:
    """A recipe's undo as the thing it puts back, not the tool: "Restore the file's earlier content, byte
    for byte: globex-brief.md (44 B before the agent's call)"; "Delete exactly the entities the call created:
    Dana". From what the step kept of its earlier read (`recipes.earlier_state`); "" with nothing kept."""
    if not isinstance(earlier, Mapping) or not earlier.get("does"):
        return ""
    does = str(earlier["does"])
    thing = _thing(earlier.get("arguments"))
    if isinstance(earlier.get("structured"), str) and thing:
        thing += f" ({size(earlier['structured'])} before the agent's call)"
    return f"{does[0].upper()}{does[1:]}" + (f": {thing}" if thing else "")


def _thing(arguments: Any) -> str:
    """What a read names, in words: a path's file name, else its plain values."""
    if not isinstance(arguments, Mapping):
        return ""
    values = [v for value in arguments.values() for v in (value if isinstance(value, list) else [value])
              if isinstance(v, str | int)]
    shown = [str(v).rstrip("/").rsplit("/", 1)[-1] if isinstance(v, str) and "/" in v else str(v)
             for v in values[:4]]
    return ", ".join(shown) + (f" and {len(values) - 4} more" if len(values) > 4 else "")


def _text(value: Any) -> str | None:
    """The text of a state that is text: a string, or a record of one string (`{"content": "…"}`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        return next(iter(value.values()))
    return None


# A line's end, when it is not the usual "\n", written out: a change of line endings alone is a change.
_ENDS = {"\r\n": "⟨CR LF⟩", "\r": "⟨CR⟩", "": "⟨no line end⟩", "\u2028": "⟨U+2028⟩", "\u2029": "⟨U+2029⟩",
         "\x85": "⟨U+0085⟩", "\x0b": "⟨U+000B⟩", "\x0c": "⟨U+000C⟩", "\x1c": "⟨U+001C⟩", "\x1d": "⟨U+001D⟩",
         "\x1e": "⟨U+001E⟩"}


def _visible_lines(text: str) -> list[str]:
    """The text's lines, each with its end written out unless it is "\n"."""
    lines = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
        end = line[len(body):]
        lines.append(body if end == "\n" else body + _ENDS.get(end, "⟨" + "+".join(
            f"U+{ord(c):04X}" for c in end) + "⟩"))
    return lines


def _lines(a: str, b: str, label_a: str, label_b: str) -> list[str]:
    diff = list(difflib.unified_diff(_visible_lines(a), _visible_lines(b), label_a, label_b, lineterm="",
                                     n=2))
    more = [f"… {len(diff) - _DIFF_LINES} more lines"] if len(diff) > _DIFF_LINES else []
    return diff[:_DIFF_LINES] + more


def _flat(value: Any, at: str = "") -> dict[str, Any]:
    """Every leaf of a record by its path in words ("Dana › entityType"): a list of named records keyed by
    their names (the name stands for the list), a list of plain values or of unnamed records (relations)
    compared as a set of lines ("Ann attends Globex kickoff")."""
    if isinstance(value, list) and all(not isinstance(i, list) for i in value) and not _named(value):
        return {at or "the record": sorted((_line(i) for i in value), key=json.dumps)}
    if not isinstance(value, Mapping | list):
        return {at or "the record": value}
    flat: dict[str, Any] = {}
    for key, item in _members(value, at):
        flat.update(_flat(item, key))
    return flat or {at or "the record": value}


def _named(value: list) -> bool:
    return bool(value) and all(isinstance(i, Mapping) and "name" in i for i in value)


def _members(value: Mapping | list, at: str):
    """A record's or a list's members, each with its path in words."""
    if isinstance(value, Mapping):
        return ((f"{at} › {key}" if at else str(key), item) for key, item in value.items())
    if _named(value):
        return ((str(i["name"]), i) for i in value)
    return ((f"{at} › {n}" if at else str(n), i) for n, i in enumerate(value))


def _line(value: Any) -> Any:
    """A member of a set, as a line: a plain value as it is, a record as its values in order."""
    if isinstance(value, Mapping):
        return " ".join(_value(v) if not isinstance(v, str) else v for v in value.values())
    return value


def _shown(value: Any, missing: bool, start: int = 0) -> str:
    if missing:
        return "(absent)"
    text = _as_text(value)
    if len(text) <= _VALUE:
        return text
    start = min(start, max(len(text) - _VALUE, 0))
    return ("…" if start else "") + text[start:start + _VALUE] + ("…" if start + _VALUE < len(text) else "")


def _as_text(value: Any) -> str:
    """A value as a reader reads it: a list of plain values one after another ("agenda sent; booked for
    Dec 4"), an empty one "(none)"."""
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return "; ".join(map(str, value)) if value else "(none)"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _cells(values: list[tuple[Any, bool]]) -> list[str]:
    """A row's cells, each cut to `_VALUE` characters: where the values differ only past that, each is
    shown from a little before the first difference, so a change never hides behind the cut."""
    texts = [_as_text(value) for value, missing in values if not missing]
    start = 0
    if len(set(texts)) > 1:
        common = len(os.path.commonprefix(texts))
        start = common - 40 if common > _VALUE - 20 else 0
    return [_shown(value, missing, start) for value, missing in values]


def three_way(before: Any, left: Any, now: Any) -> dict[str, Any]:
    """A conflict as a text diff (`{"text": {"agent": lines, "since": lines}}`: what the agent changed, and
    what changed since it) or as a field diff (`{"fields": [{"field", "before", "left", "now"}]}`), given
    the record before the call, as the agent left it (None when not kept) and now."""
    texts = [_text(state) for state in (before, left, now)]
    if texts[0] is not None and texts[2] is not None:
        shown = {"since": _lines(texts[1] if texts[1] is not None else texts[0], texts[2],
                                 "as the agent left it" if texts[1] is not None else "before the agent",
                                 "now")}
        if texts[1] is not None:
            shown["agent"] = _lines(texts[0], texts[1], "before the agent", "as the agent left it")
        return {"text": shown}
    return _fields([_flat(state) if state is not None else None for state in (before, left, now)])


def field_changes(before: dict[str, Any] | None, left: dict[str, Any] | None,
                  now: dict[str, Any]) -> dict[str, Any]:
    """A HATP conflict field by field (`{"fields": [{"field", "before", "left", "now"}]}`), from the field
    values a server gave: the call's effect's `before` and `after` (the fields it changed, and maybe more)
    and the record's `fields` now. The rows are the fields the effect names, where the three differ; a
    field the server did not give in one of them reads "(not given)". Without the effect's values, every
    field given now is shown beside what is not known."""
    named = [state for state in (before, left) if state is not None]
    keys = sorted({key for state in named for key in state}) if named else sorted(now)
    rows = []
    for key in keys:
        cells = [(state or {}).get(key, NOT_GIVEN) for state in (before, left, now)]
        if len({json.dumps(cell) for cell in cells}) > 1 or not named:
            shown = _cells([(cell, cell is NOT_GIVEN) for cell in cells])
            rows.append({"field": key, **{name: cell if cell is NOT_GIVEN else text for name, cell, text
                                          in zip(("before", "left", "now"), cells, shown, strict=True)}})
    return {"fields": rows[:_FIELDS], **({"more": len(rows) - _FIELDS} if len(rows) > _FIELDS else {})}


def _fields(flats: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The fields that differ between the flattened states (None: a state not kept)."""
    keys = sorted({key for flat in flats if flat is not None for key in flat})
    rows = []
    for key in keys:
        cells = [(flat.get(key), key not in flat) if flat is not None else (None, True) for flat in flats]
        kept = [json.dumps(value) if not gone else "\0"
                for (value, gone), flat in zip(cells, flats, strict=True) if flat is not None]
        if len(set(kept)) > 1:
            rows.append({"field": key, **dict(zip(("before", "left", "now"), _cells(cells), strict=True))})
    if flats[1] is None:
        for row in rows:
            row["left"] = NOT_KEPT
    return {"fields": rows[:_FIELDS], **({"more": len(rows) - _FIELDS} if len(rows) > _FIELDS else {})}


def after_the_agent(value: Any, finished: Any) -> str:
    """How long after the agent's call (`finished`, when it ended) a server says a record changed (`value`,
    its RFC 3339 `changedAt`): "12 minutes after the agent's change"; "" when either is not a moment."""
    if not isinstance(value, str) or not isinstance(finished, datetime):
        return ""
    try:
        changed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return ""
    if changed.utcoffset() is None or finished.utcoffset() is None:
        return ""
    seconds = (changed - finished).total_seconds()
    if seconds < 0:
        return "before the agent's change"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''} after the agent's change"
    return "less than a minute after the agent's change"
