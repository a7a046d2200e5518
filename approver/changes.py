"""What an undo did to a record, read from its states (a recipe's reads: `structuredContent`, or text): the
record as a set of facts, each leaf value with the path to it, so that "the agent's change is taken back" and
"the newer change is kept" can be told apart from "the record reads as before the agent". Pure.

An array's element is named by its own `name` or `id` (the memory server's entities), else by its content
(its observations, its relations): order is never a change. Text is its lines."""

import json
from typing import Any

Fact = tuple[tuple[str, ...], str]


def facts(state: Any) -> set[Fact]:
    if isinstance(state, str):
        return {(("line",), line) for line in state.splitlines()}
    found: set[Fact] = set()
    _walk(state, (), found)
    return found


def _walk(value: Any, path: tuple[str, ...], found: set[Fact]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(item, (*path, str(key)), found)
    elif isinstance(value, list):
        for item in value:
            _walk(item, (*path, _named(item)), found)
    else:
        found.add((path, _canonical(value)))


def _named(item: Any) -> str:
    if isinstance(item, dict):
        for key in ("name", "id"):
            if isinstance(item.get(key), str | int):
                return f"{key}={item[key]}"
    return _canonical(item)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def taken_back_and_kept(*, before: Any, left: Any, seen: Any, after: Any) -> tuple[bool, bool]:
    """Whether, after an undo, the agent's change (from `before` to `left`) is taken back, and whether the
    change made since (from `left` to `seen`, the state the approvers chose to undo over) is kept."""
    b, l_, s, a = facts(before), facts(left), facts(seen), facts(after)
    added, removed = l_ - b, b - l_
    since_added, since_removed = s - l_, l_ - s
    taken_back = not (added - since_added) & a and (removed - since_removed) <= a
    kept = since_added <= a and not since_removed & a
    return taken_back, kept
