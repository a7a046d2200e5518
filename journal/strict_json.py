"""Reading JSON that someone else wrote: bounded in size and depth before it is parsed, and refused when an
object names a key twice (RFC 8259 leaves that to the reader; I-JSON, RFC 7493, forbids it).

Python's parser recurses once per level, so a document nested 100,000 deep is a RecursionError, not a
clear answer; and `{"agent": "bo", "agent": "mallory"}` reads as mallory to one program and bo to another.
`nesting_depth` finds the depth without parsing (brackets outside strings), so both are caught first.
"""

import json
import re
from typing import Any

# Deep enough for any real tool call (the MCP SDKs' own schemas nest a few levels), shallow enough that
# every recursive walk over it (canonical JSON, pydantic, the templates) stays far from Python's limit.
MAX_DEPTH = 64
# A JSON-RPC message carries such a value two levels down (`params.arguments`, `result.content`).
MESSAGE_MAX_DEPTH = MAX_DEPTH + 2

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


class JsonRefused(ValueError):
    """JSON this system will not read; the message says why, in words for the person who sent it."""


def nesting_depth(text: str | bytes) -> int:
    """How deep the arrays and objects of a JSON text nest, without parsing it (0 for a scalar)."""
    data = text.encode("utf-8", errors="surrogatepass") if isinstance(text, str) else bytes(text)
    deepest = depth = 0
    for bracket in _BRACKET.findall(_STRING.sub(b'""', data)):
        if bracket in b"[{":
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


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = {}
    for key, value in pairs:
        if key in result:
            raise JsonRefused(f"the key {key[:80]!r} appears twice in one object")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
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
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except JsonRefused:
        raise
    except (ValueError, RecursionError) as exc:
        raise JsonRefused(f"{what} is not JSON: {exc}") from None
