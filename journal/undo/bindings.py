"""Bindings: how a compensation's arguments are taken from the original call.

Two syntaxes arrive from tool servers:

- SEP-3172 runtime expressions: `$response.body#/a/b` (the result's `structuredContent`) and
  `$request.body#/a/b` (the call's arguments); the part after `#` is an RFC 6901 JSON Pointer, resolved by
  the `jsonpointer` library (so `~0`, `~1` and the empty key behave as the RFC says). Values that are not
  strings starting with `$` are literals. An admin's undo recipe (`journal.undo.recipes`) adds `$before.body`,
  the `structuredContent` of the earlier-state read the Recorder made just before the call, and `*`, a
  token that stands for every element of an array (`$response.body#/entities/*/name`: the names of every
  entity the call reports it created), and `{"$each": <expression>, "as": {<name>: "$item#/…", …}}`, an array
  built from every element of another (the observations a call added, reshaped into the deletions that take
  them back), and `{"$match": <expression>, "pattern": "On branch (\\S+)"}`, what one group of a regular
  expression captures in a text (a server that answers only in text).
- mcp-compensate (ChronoMCP) paths: `$.input.a.b` (arguments) and `$.output.a.b` (the whole result object),
  object keys only.

A binding that does not resolve is an error, never a default: SEP-3172 says such a step is not
automatically undoable, and a compensation must never run with partial arguments. A binding that resolves
to `null` is treated the same way, because a null identifier names nothing to undo.
"""

from collections.abc import Mapping
from typing import Any, Literal

import jsonpointer

from . import patterns

Dialect = Literal["sep3172", "chronomcp", "recipe"]


class BindingError(ValueError):
    """A binding that cannot produce a concrete value; the message says which and why."""


class NothingToUndo(BindingError):
    """A `*` binding over an empty array: the call reports it changed nothing (a server that skipped every
    duplicate), so there is nothing to compensate."""


WILDCARD = "*"
_SOURCES = {
    "$response.body": ("response", "the response body (structuredContent)"),
    "$request.body": ("request", "the request body (arguments)"),
    "$before.body": ("before", "the earlier state (what the Recorder read before the call)"),
}


EACH, AS, ITEM = "$each", "as", "$item"
# `{"$match": <expression>, "pattern": <regex with one group>}`: what the group captures in the text the
# expression names (the branch in a server's text answer: "On branch (\\S+)").
MATCH, PATTERN = "$match", "pattern"


def _match_problem(binding: dict) -> str | None:
    pattern = binding.get(PATTERN)
    if set(binding) != {MATCH, PATTERN} or not isinstance(pattern, str) or len(pattern) > 200:
        return f"{binding!r}: a {MATCH} binding has exactly {MATCH} and {PATTERN} (a regular expression)"
    return patterns.problem(pattern, groups=1)


def expression_problem(expression: Any, *, sources: tuple[str, ...] = tuple(_SOURCES)) -> str | None:
    """Why `expression` is not a runtime expression over one of `sources` (None when it is, or when it is a
    literal): for checking a recipe when it is saved, before any call."""
    if isinstance(expression, dict) and MATCH in expression:
        return _match_problem(expression) or expression_problem(expression[MATCH], sources=sources)
    if isinstance(expression, dict) and EACH in expression:
        template = expression.get(AS)
        if set(expression) != {EACH, AS} or not isinstance(template, dict) or not template:
            return f"{expression!r}: an {EACH} binding has exactly {EACH} and {AS} (an object of bindings)"
        return expression_problem(expression[EACH], sources=sources) or next(
            (problem for value in template.values()
             if (problem := expression_problem(value, sources=(ITEM, *sources))) is not None), None)
    if not isinstance(expression, str) or not expression.startswith("$"):
        return None
    source, _, pointer = expression.partition("#")
    if source not in sources:
        return f"{expression!r}: use one of {', '.join(sources)}, not {source!r}"
    if pointer and not pointer.startswith("/"):
        return f"{expression!r}: {pointer!r} is not a JSON Pointer (must be empty or start with '/')"
    try:
        jsonpointer.JsonPointer(pointer)
    except jsonpointer.JsonPointerException as exc:
        return f"{expression!r}: {exc}"
    return None


def resolve_runtime_expression(expression: Any, *, request: Any, response: Any, before: Any = None,
                               item: Any = None) -> Any:
    if isinstance(expression, dict) and EACH in expression:
        return _each(expression, request=request, response=response, before=before)
    if isinstance(expression, dict) and MATCH in expression:
        return _match(expression, request=request, response=response, before=before, item=item)
    if not isinstance(expression, str) or not expression.startswith("$"):
        return expression
    source, _, pointer = expression.partition("#")
    if source == ITEM and item is not None:
        which, label, document = ITEM, "the element", item
    elif source in _SOURCES:
        which, label = _SOURCES[source]
        document = {"request": request, "response": response, "before": before}[which]
    else:
        raise BindingError(f"{expression!r}: unsupported runtime expression {source!r}")
    if document is None:
        raise BindingError(f"{expression!r}: {label} is absent")
    if pointer and not pointer.startswith("/"):
        raise BindingError(
            f"{expression!r}: {pointer!r} is not a JSON Pointer (must be empty or start with '/')"
        )
    try:
        parts = jsonpointer.JsonPointer(pointer).parts
    except jsonpointer.JsonPointerException as exc:
        raise BindingError(f"{expression!r}: {exc}") from None
    return _walk(document, parts, expression=expression, label=label, walked="")


def _each(binding: dict, *, request: Any, response: Any, before: Any) -> list[Any]:
    """`{"$each": expression, "as": template}`: the template, resolved for every element of the array the
    expression names (`$item#/…` is that element)."""
    template = binding.get(AS)
    if set(binding) != {EACH, AS} or not isinstance(template, dict) or not template:
        raise BindingError(f"{binding!r}: an {EACH} binding has exactly {EACH} and {AS}")
    elements = resolve_runtime_expression(binding[EACH], request=request, response=response, before=before)
    if not isinstance(elements, list):
        raise BindingError(f"{binding[EACH]!r} is not an array")
    if not elements:
        raise NothingToUndo(f"{binding[EACH]!r} is an empty array: the call reports nothing to undo")
    return [{name: resolve_runtime_expression(value, request=request, response=response, before=before,
                                              item=element) for name, value in template.items()}
            for element in elements]


def _match(binding: dict, *, request: Any, response: Any, before: Any, item: Any) -> str:
    if (problem := _match_problem(binding)) is not None:
        raise BindingError(problem)
    text = resolve_runtime_expression(binding[MATCH], request=request, response=response, before=before,
                                      item=item)
    found = patterns.search(binding[PATTERN], text)
    if found is None or not found.group(1):
        raise BindingError(f"{binding[MATCH]!r} does not match {binding[PATTERN]!r}")
    return found.group(1)


def _walk(document: Any, parts: list[str], *, expression: str, label: str, walked: str) -> Any:
    """The value at `parts` in `document`; `*` on an array maps the rest over every element."""
    for index, part in enumerate(parts):
        if part == WILDCARD and isinstance(document, list):
            if not document:
                raise NothingToUndo(f"{expression!r}: {walked or '/'} in {label} is an empty array: the call "
                                    "reports nothing to undo")
            rest = parts[index + 1:]
            return [_walk(item, rest, expression=expression, label=label, walked=f"{walked}/{n}")
                    for n, item in enumerate(document)]
        pointer = jsonpointer.JsonPointer.from_parts([part])
        try:
            document = pointer.resolve(document)
        except jsonpointer.JsonPointerException as exc:
            raise BindingError(f"{expression!r}: no value at {walked}/{part} in {label} ({exc})") from None
        if isinstance(document, jsonpointer.EndOfList):  # "-" names the slot after the last element
            raise BindingError(f"{expression!r}: {walked}/{part} points past the end of an array")
        walked = f"{walked}/{part}"
    if document is None:
        raise BindingError(f"{expression!r}: the value at {walked or '/'} is null")
    return document


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
    bindings: Mapping[str, Any], *, dialect: Dialect, request: Any, response: Any, before: Any = None
) -> dict[str, Any]:
    """Resolve every binding or raise `BindingError` naming each one that failed (`NothingToUndo` when every
    failure is an empty `*` array). `before` (the earlier state) is for recipes, whose bindings are
    runtime expressions."""
    resolved: dict[str, Any] = {}
    problems: list[BindingError] = []
    for name, expression in bindings.items():
        try:
            if dialect == "chronomcp":
                resolved[name] = resolve_chronomcp_path(expression, request=request, response=response)
            else:
                resolved[name] = resolve_runtime_expression(expression, request=request, response=response,
                                                            before=before)
        except BindingError as exc:
            problems.append(BindingError(f"{name}: {exc}") if not isinstance(exc, NothingToUndo)
                            else NothingToUndo(f"{name}: {exc}"))
    if problems:
        kind = NothingToUndo if all(isinstance(p, NothingToUndo) for p in problems) else BindingError
        raise kind("; ".join(str(p) for p in problems))
    return resolved
