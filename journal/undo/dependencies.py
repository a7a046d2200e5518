"""Inferring links between steps from values (docs/design.md: "infer links where a later argument equals a
value
from an earlier result").

Only distinctive values count: strings of 4 to 200 characters and integers of five digits or more. Short
strings and small numbers ("Won", 1, true) appear everywhere and would link everything to everything. A
false link is safe (it only makes a plan undo more); a missed link is why the all-earlier rule stays the
default.

So that inference stays cheap however long a run is, a later call is linked only to the most recent earlier
step whose result had the value, a value that more than COMMON_AFTER of the run's results had ("12:00",
"Asia/Tokyo" from a clock tool) is no longer used, and a step gets at most MAX_LINKS inferred links (the
most recent steps).
"""

import hashlib
from collections.abc import Iterator
from typing import Any

MAX_VALUES = 200
COMMON_AFTER = 8
MAX_LINKS = 16


def escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def leaves(value: Any, pointer: str = "") -> Iterator[tuple[str, Any]]:
    """Every scalar in a JSON document with its RFC 6901 pointer."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from leaves(inner, f"{pointer}/{escape(str(key))}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from leaves(inner, f"{pointer}/{index}")
    else:
        yield pointer, value


def distinctive(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        return 4 <= len(value) <= 200
    if isinstance(value, int):
        return abs(value) >= 10000
    return False


def digest(value: Any) -> str:
    return hashlib.sha256(f"{type(value).__name__}:{value}".encode("utf-8", "replace")).hexdigest()[:32]


def distinctive_values(document: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(digest, pointer) for the distinctive scalars of a document, at most MAX_VALUES of them."""
    found = []
    for pointer, value in leaves(document, prefix):
        if distinctive(value):
            found.append((digest(value), pointer))
            if len(found) >= MAX_VALUES:
                break
    return found


def first_pointers(found: list[tuple[str, str]]) -> dict[str, str]:
    """Each digest of `distinctive_values` with the first pointer it was at."""
    first: dict[str, str] = {}
    for value_digest, pointer in found:
        first.setdefault(value_digest, pointer)
    return first


def choose_links(
    wanted: list[tuple[str, str]], known: dict[str, tuple[int, str, int]]
) -> dict[int, list[dict]]:
    """The inferred links of a call whose arguments have the values `wanted` ((digest, pointer) pairs), given
    what the run's earlier results had: `known` maps a digest to (the most recent step that had it, where in
    its result, in how many results it was). Returns {step: [{"from": result pointer, "to": argument
    pointer}]}, at most MAX_LINKS steps, the most recent ones (steps are numbered in the order they ran).
    `journal.services.one_statement._close_sql` chooses the same in SQL: a change here is one there."""
    found: dict[int, list[dict]] = {}
    for value_digest, to in wanted:
        hit = known.get(value_digest)
        if hit is None or hit[2] > COMMON_AFTER:
            continue
        found.setdefault(hit[0], []).append({"from": hit[1], "to": to})
    return {step: found[step] for step in sorted(found, reverse=True)[:MAX_LINKS]}
