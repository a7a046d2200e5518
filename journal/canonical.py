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
