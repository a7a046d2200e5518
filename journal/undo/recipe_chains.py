"""A run's recipe calls that read the same record, one after another, and what each call touches. No ORM
and no clock.

An agent may change one record several times in a run (write a file, then edit it). Each call's undo
restores what was there just before that call, and a plan undoes the latest first: so when a plan is
checked, the first call's record is where the last call left it, and that is no conflict. These say which
calls read the same record, and where the run left it.
"""

from collections.abc import Mapping
from typing import Any

from ..record.canonical import canonical_bytes, sha256_hex
from . import recipes
from .bindings import BindingError, resolve_arguments


def read_key(earlier: Mapping[str, Any] | None) -> str:
    """What a kept earlier state read (the read tool and its arguments), so that two steps that read the
    same record can be told apart from two that did not."""
    if not earlier or "version" not in earlier:
        return ""
    return sha256_hex({"tool": earlier.get("tool"), "arguments": earlier.get("arguments") or {}})


def reads_overlap(one: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> bool:
    """Whether two kept earlier states may have read the same record: the same read tool, with a value in
    common among their read's arguments and what their recipes say the calls touch (the same path; an
    entity named in both, or by a relation the other call made)."""
    if not one or not other or one.get("tool") != other.get("tool"):
        return False
    return bool(_named(one) & _named(other))


def _named(earlier: Mapping[str, Any]) -> set[str]:
    return _leaves(earlier.get("arguments")) | _leaves(earlier.get("touches") or [])


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


def touched(recipe: "recipes.Recipe", arguments: Mapping[str, Any]) -> list[Any]:
    """The values the recipe's `touches` bindings name in a call's arguments (those that resolve)."""
    found = []
    for expression in recipe.touches:
        try:
            value = resolve_arguments({"t": expression}, dialect="recipe", request=dict(arguments),
                                      response=None)["t"]
        except BindingError:
            continue
        found.extend(value if isinstance(value, list) else [value])
    return found


def version_of_state(state: Any, earlier: Mapping[str, Any]) -> str:
    """The version `earlier`'s read gives a record that read `state` (a kept `structuredContent`, or its
    text), compared its way; "" when it cannot be told."""
    if state is None:
        return ""
    answer = {"content": [{"type": "text", "text": state}]} if isinstance(state, str) else {
        "structuredContent": state}
    try:
        return recipes.version(answer, earlier.get("versionAt") or "",
                               ignore_order=bool(earlier.get("ignoreOrder")),
                               pattern=earlier.get("versionPattern"))
    except ValueError:
        return ""
