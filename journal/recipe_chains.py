"""A run's recipe calls that read the same record, one after another. No ORM and no clock.

An agent may change one record several times in a run (write a file, then edit it). Each call's undo
restores what was there just before that call, and a plan undoes the latest first: so when a plan is
checked, the first call's record is where the last call left it, and that is no conflict. These say which
calls read the same record, and where the run left it.
"""

from collections.abc import Mapping
from typing import Any

from .canonical import canonical_bytes, sha256_hex


def read_key(earlier: Mapping[str, Any] | None) -> str:
    """What a kept earlier state read (the read tool and its arguments), so that two steps that read the
    same record can be told apart from two that did not."""
    if not earlier or "version" not in earlier:
        return ""
    return sha256_hex({"tool": earlier.get("tool"), "arguments": earlier.get("arguments") or {}})


def reads_overlap(one: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> bool:
    """Whether two kept earlier states may have read the same record: the same read tool, with an argument
    value in common (the same path; an entity named in both)."""
    if not one or not other or one.get("tool") != other.get("tool"):
        return False
    return bool(_leaves(one.get("arguments")) & _leaves(other.get("arguments")))


def _leaves(value: Any) -> set[str]:
    if isinstance(value, Mapping):
        return set().union(*(_leaves(item) for item in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_leaves(item) for item in value)) if value else set()
    return {canonical_bytes(value).decode()}


def left_by_the_run(after: str, later: list[tuple[str, str]]) -> str:
    """The version the agent's run left a record at, from the version one of its calls left it at and the
    (before, after) versions of the run's later calls that read the same record, in order: a later call that
    found it where the earlier one left it moved it on. The undo of those later calls comes first, so a
    record at that version is where this undo expects it."""
    for before, left in later:
        if before == after:
            after = left
    return after
