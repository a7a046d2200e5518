"""Canonical JSON (RFC 8785, JCS) and hashing, through the `rfc8785` library.

Tool servers are not trusted to send I-JSON: a hostile result may carry an integer beyond 2**53 or a lone
surrogate, which JCS cannot encode. `to_ijson` rewrites such values before anything is hashed or stored
(big integers become their decimal string, lone surrogates become U+FFFD), so what is stored is exactly what
was hashed and a later verification recomputes the same bytes.
"""

import hashlib
import math
import re
from typing import Any

import rfc8785

_MAX_SAFE_INT = 2**53 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def to_ijson(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _has_surrogate(value) else value
    if isinstance(value, dict):
        return {to_ijson(str(k)): to_ijson(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_ijson(v) for v in value]
    return str(value)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def canonical_bytes(value: Any) -> bytes:
    """The RFC 8785 bytes of `value`, which must already be I-JSON (see `to_ijson`)."""
    return rfc8785.dumps(value)


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def ijson_problem(value: Any) -> str | None:
    """Where and why `value` is not I-JSON (RFC 7493), so that canonicalising it would change it, or None.

    A call whose arguments the Recorder would journal (and an approver would sign) in another form than the
    server receives must not be sent: a big integer becomes a string in the record but stays a number on the
    wire, a lone surrogate becomes U+FFFD. Walks with its own stack, so any depth is safe."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or _has_surrogate(key):
                    return f"at {where or '/'}: a key has a lone UTF-16 surrogate, which is not Unicode text"
                stack.append((f"{where}/{_pointer_token(key)}", child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}/{index}", child) for index, child in enumerate(item))
        elif (problem := _scalar_problem(item)) is not None:
            return f"at {where or '/'}: {problem}"
    return None


def _scalar_problem(item: Any) -> str | None:
    """Why a value that is neither an object nor an array is not I-JSON, or None."""
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, int):
        if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
            return (
                f"{str(item)[:40]} is an integer beyond ±(2**53 - 1), which JSON numbers do not carry "
                f"exactly "
                "(send it as a string)"
            )
        return None
    if isinstance(item, float):
        return (
            None if math.isfinite(item) else f"{item} is not a JSON number (NaN and infinities are not JSON)"
        )
    if isinstance(item, str):
        return (
            "the text has a lone UTF-16 surrogate, which is not Unicode text"
            if _has_surrogate(item)
            else None
        )
    return f"a {type(item).__name__} is not JSON"


def _pointer_token(key: str) -> str:
    """A key as a JSON Pointer (RFC 6901) reference token, shortened for a message."""
    return key.replace("~", "~0").replace("/", "~1")[:60]
