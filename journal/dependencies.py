"""Inferring links between steps from values (DESIGN.md: "infer links where a later argument equals a value
from an earlier result").

Only distinctive values count: strings of 4 to 200 characters and integers of five digits or more. Short
strings and small numbers ("Won", 1, true) appear everywhere and would link everything to everything. A
false link is safe (it only makes a plan undo more); a missed link is why the all-earlier rule stays the
default.
"""

import hashlib
from collections.abc import Iterator
from typing import Any

MAX_VALUES = 200


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
