"""Reading JSON that someone else wrote: bounded in size and depth before it is parsed, and refused when an
object names a key twice (RFC 8259 leaves that to the reader; I-JSON, RFC 7493, forbids it).

Python's parser recurses once per level, so a document nested 100,000 deep is a RecursionError, not a
clear answer; and `{"agent": "bo", "agent": "mallory"}` reads as mallory to one program and bo to another.
`nesting_depth` finds the depth without parsing (brackets outside strings), so both are caught first.
"""

import json
from typing import Any

# Deep enough for any real tool call (the MCP SDKs' own schemas nest a few levels), shallow enough that
# every recursive walk over it (canonical JSON, pydantic, the templates) stays far from Python's limit.
MAX_DEPTH = 64
# A JSON-RPC message carries such a value two levels down (`params.arguments`, `result.content`).
MESSAGE_MAX_DEPTH = MAX_DEPTH + 2

# Bytes outside strings, brackets only, each object's braces as an array's: what the depth depends on.
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


class JsonRefused(ValueError):
    """JSON this system will not read; the message says why, in words for the person who sent it."""


def nesting_depth(text: str | bytes) -> int:
    """How deep the arrays and objects of a JSON text nest, without parsing it (0 for a scalar).

    All in bytes operations: escaped backslashes and quotes are dropped, so every quote left opens or closes
    a string; what is outside strings is kept, its brackets only; then each pass drops every innermost
    pair, and the passes it takes to empty it are the depth (the rest, unbalanced or very deep, is counted
    one bracket at a time)."""
    data = text.encode("utf-8", errors="surrogatepass") if isinstance(text, str) else bytes(text)
    if b'"' in data:
        data = b"".join(data.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    brackets = data.translate(_AS_BRACKETS, _NOT_BRACKETS)
    depth = 0
    while brackets and depth < _PASSES:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets, depth = inner, depth + 1
    return depth + _counted(brackets) if brackets else depth


# Passes of `nesting_depth` before the rest is counted bracket by bracket (each pass reads the whole text).
_PASSES = 100


def _counted(brackets: bytes) -> int:
    deepest = depth = 0
    for bracket in brackets:
        if bracket == 0x5B:  # [
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def deeper_than(data: bytes | bytearray, limit: int) -> int | None:
    """The nesting depth of `data` when it is over `limit`, else None; cheap when it has few brackets."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return None
    depth = nesting_depth(data)
    return depth if depth > limit else None


def value_depth(value: Any, *, limit: int = MAX_DEPTH) -> int:
    """How deep a parsed value nests, counting no further than `limit + 1` (so a hostile value costs
    nothing beyond the limit). Walks with its own stack, never Python's."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest


def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object of `pairs` (an `object_pairs_hook`), refused when it names a key twice."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise JsonRefused(f"the key {twice[:80]!r} appears twice in one object")
    return result


def no_constants(name: str) -> Any:
    raise JsonRefused(f"{name} is not a JSON number")


def loads(
    text: str | bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH, what: str = "the document"
) -> Any:
    """Parse `text` as strict JSON: at most `max_bytes` and `max_depth`, no key twice in an object."""
    size = len(text.encode("utf-8")) if isinstance(text, str) else len(text)
    if size > max_bytes:
        raise JsonRefused(f"{what} is {size} bytes; the limit is {max_bytes}")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JsonRefused(f"{what} nests {depth} levels deep; the limit is {max_depth}")
    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except JsonRefused:
        raise
    except (ValueError, RecursionError) as exc:
        raise JsonRefused(f"{what} is not JSON: {exc}") from None
