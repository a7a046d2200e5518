"""Bindings: how a compensation's arguments are taken from the original call.

Two syntaxes arrive from tool servers:

- SEP-3172 runtime expressions: `$response.body#/a/b` (the result's `structuredContent`) and
  `$request.body#/a/b` (the call's arguments); the part after `#` is an RFC 6901 JSON Pointer, resolved by
  the `jsonpointer` library (so `~0`, `~1` and the empty key behave as the RFC says). Values that are not
  strings starting with `$` are literals.
- mcp-compensate (ChronoMCP) paths: `$.input.a.b` (arguments) and `$.output.a.b` (the whole result object),
  object keys only.

A binding that does not resolve is an error, never a default: SEP-3172 says such a step is not
automatically undoable, and a compensation must never run with partial arguments. A binding that resolves
to `null` is treated the same way, because a null identifier names nothing to undo.
"""

from collections.abc import Mapping
from typing import Any, Literal

import jsonpointer

Dialect = Literal["sep3172", "chronomcp"]


class BindingError(ValueError):
    """A binding that cannot produce a concrete value; the message says which and why."""


def resolve_runtime_expression(expression: Any, *, request: Any, response: Any) -> Any:
    if not isinstance(expression, str) or not expression.startswith("$"):
        return expression
    source, _, pointer = expression.partition("#")
    if source == "$response.body":
        document, label = response, "the response body (structuredContent)"
    elif source == "$request.body":
        document, label = request, "the request body (arguments)"
    else:
        raise BindingError(f"{expression!r}: unsupported runtime expression {source!r}")
    if document is None:
        raise BindingError(f"{expression!r}: {label} is absent")
    if pointer and not pointer.startswith("/"):
        raise BindingError(
            f"{expression!r}: {pointer!r} is not a JSON Pointer (must be empty or start with '/')"
        )
    try:
        value = jsonpointer.resolve_pointer(document, pointer)
    except jsonpointer.JsonPointerException as exc:
        raise BindingError(f"{expression!r}: no value at {pointer!r} in {label} ({exc})") from None
    if isinstance(value, jsonpointer.EndOfList):  # "-" names the slot after the last element: no value
        raise BindingError(f"{expression!r}: {pointer!r} points past the end of an array")
    if value is None:
        raise BindingError(f"{expression!r}: the value at {pointer!r} is null")
    return value


def resolve_chronomcp_path(path: Any, *, request: Any, response: Any) -> Any:
    if not isinstance(path, str) or not path.startswith("$."):
        raise BindingError(f"{path!r}: a parameterMapping value must be a path like '$.output.id'")
    root, *keys = path[2:].split(".")
    if root == "input":
        current = request
    elif root == "output":
        current = response
    else:
        raise BindingError(f"{path!r}: paths start with $.input or $.output, not $.{root}")
    if not keys or any(key == "" for key in keys):
        raise BindingError(f"{path!r}: empty path segment")
    walked = f"$.{root}"
    for key in keys:
        if not isinstance(current, Mapping) or key not in current:
            raise BindingError(f"{path!r}: no key {key!r} under {walked}")
        current = current[key]
        walked += f".{key}"
    if current is None:
        raise BindingError(f"{path!r}: the value is null")
    return current


def resolve_arguments(
    bindings: Mapping[str, Any], *, dialect: Dialect, request: Any, response: Any
) -> dict[str, Any]:
    """Resolve every binding or raise `BindingError` naming each one that failed."""
    resolve = resolve_runtime_expression if dialect == "sep3172" else resolve_chronomcp_path
    resolved: dict[str, Any] = {}
    problems: list[str] = []
    for name, expression in bindings.items():
        try:
            resolved[name] = resolve(expression, request=request, response=response)
        except BindingError as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        raise BindingError("; ".join(problems))
    return resolved
