"""Canonical JSON (RFC 8785, JCS) and hashing, through the `rfc8785` library, with a fast path.

The fast path is orjson's compiled encoder (keys sorted, no whitespace, UTF-8 as it is), which writes exactly
JCS's bytes for the values it takes: no float but those Python and ECMAScript both write in plain
digits ("9.123", not "1e-07", "1.0" or "-0.0"), and no key with a character beyond the Basic Multilingual
Plane (where sorting by code point and by UTF-16 code unit could differ). Anything else goes to the library.
`tests/journal/record/test_canonical.py` proves the two byte-equal on every I-JSON value Hypothesis finds.

Tool servers are not trusted to send I-JSON: a hostile result may carry an integer beyond 2**53 or a lone
surrogate, which JCS cannot encode. `to_ijson` rewrites such values before anything is hashed or stored
(big integers become their decimal string, lone surrogates become U+FFFD), so what is stored is exactly what
was hashed and a later verification recomputes the same bytes.
"""

import hashlib
import json
import math
import re
from typing import Any

import orjson
import rfc8785

_MAX_SAFE_INT = 2**53 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def to_ijson(value: Any) -> Any:
    """`value` as the record keeps it: I-JSON, its texts storable (see the module). A value that is so
    already (most are) is given back as it is, not copied."""
    return value if _already_ijson(value) else _rewritten(value)


def _rewritten(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _storable(value)
    if isinstance(value, dict):
        return {_rewritten(str(k)): _rewritten(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rewritten(v) for v in value]
    return str(value)


def _already_ijson(value: Any) -> bool:
    """Whether `_rewritten` would give back an equal value of the same types: JSON's own types exactly (not a
    subclass or a tuple), safe integers, finite floats, texts without U+0000 or a lone surrogate. Walks with
    its own stack, so any depth is safe."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str:
            if not _storable_as_is(item):
                return False
        elif kind is dict:
            for key, child in item.items():
                if type(key) is not str or not _storable_as_is(key):
                    return False
                push(child)
        elif kind is list:
            extend(item)
        elif kind is int:
            if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is not bool and item is not None:
            return False
    return True


def _storable_as_is(text: str) -> bool:
    return "\x00" not in text and (text.isascii() or not _has_surrogate(text))


def _storable(text: str) -> str:
    """`text` as the record keeps it: a lone surrogate (not Unicode text) and U+0000 (which PostgreSQL keeps
    neither in text nor in jsonb) become U+FFFD, the same on every database, in what is stored and hashed."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    elif text.isascii():  # the usual text, found at once: no surrogate can be in it
        return text
    return _SURROGATE.sub("\ufffd", text) if _has_surrogate(text) else text


def storable_text(text: str) -> str:
    """A text from outside (a server's error, a name an agent gives) as a text column keeps it
    (`_storable`)."""
    return _storable(text) if isinstance(text, str) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_ENCODE = orjson.dumps
_SORTED = orjson.OPT_SORT_KEYS
_BEYOND_BMP = "\U00010000"


def canonical_bytes(value: Any) -> bytes:
    """The RFC 8785 bytes of `value`, which must already be I-JSON (see `to_ijson`)."""
    if _plain(value):
        try:
            return _ENCODE(value, option=_SORTED)
        except orjson.JSONEncodeError:  # a lone surrogate, or nested past orjson's 255: the library's say
            pass
    return rfc8785.dumps(value)


def members(value: dict[str, Any]) -> dict[str, bytes]:
    """Each member of an I-JSON object written in JCS on its own, for `joined` to put together: the members
    known early are written early (off the journal thread), and one known only later costs only itself."""
    return {key: canonical_bytes(child) for key, child in value.items()}


def joined(written: dict[str, bytes]) -> bytes:
    """The JCS bytes of an object from its members' (`members`): keys sorted by their UTF-16 code units."""
    keys = sorted(written, key=_utf16)
    return b"{" + b",".join(canonical_bytes(key) + b":" + written[key] for key in keys) + b"}"


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be")


def _plain(value: Any) -> bool:
    """Whether the fast path writes `value` exactly as JCS does (see the module). Exact types only: a
    subclass of str or int may write itself otherwise, so it goes to the library."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str or not (key.isascii() or max(key) < _BEYOND_BMP):
                    return False
                kind = type(child)
                if kind is str or kind is bool or child is None:
                    continue
                push(child)
        elif kind is list:
            extend(item)
        elif kind is int:
            if not -_MAX_SAFE_INT <= item <= _MAX_SAFE_INT:
                return False  # not I-JSON: the library refuses it
        elif kind is float:
            written = repr(item)
            if "e" in written or written.endswith(".0") or not math.isfinite(item):
                return False
        else:
            return False  # a tuple, a subclass, or anything else the library is to judge
    return True


def from_jsonb(value: Any) -> Any:
    """A value as PostgreSQL's jsonb gives it back, with its floats' type restored. jsonb keeps a number's
    value, not its form: the float 1e21 comes back as the integer 1000000000000000000000, which JCS cannot
    write. Nothing is stored as an integer beyond ±(2**53 - 1) (`to_ijson` makes those strings), so such
    an integer was a float, and is given back as the float it was."""
    kind = type(value)
    if kind is int:
        return float(value) if not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT else value
    if kind is dict:
        return {key: from_jsonb(child) for key, child in value.items()}
    if kind is list:
        return [from_jsonb(child) for child in value]
    return value


def loads_record(text: str) -> Any:
    """JSON text as the record stored it, read as `from_jsonb` gives it back (an integer beyond ±(2**53 - 1)
    is the float it was), in the parse itself: only the integers are looked at, not every value."""
    return json.loads(text, parse_int=_record_int)


def _record_int(digits: str) -> int | float:
    value = int(digits)
    return value if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT else float(value)


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
                if "\x00" in key:
                    return f"at {where or '/'}: a key has U+0000 (NUL), {_NUL}"
                stack.append((f"{where}/{_pointer_token(key)}", child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}/{index}", child) for index, child in enumerate(item))
        elif (problem := _scalar_problem(item)) is not None:
            return f"at {where or '/'}: {problem}"
    return None


_NUL = "which the run's record cannot keep exactly"


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
        if "\x00" in item:
            return f"the text has U+0000 (NUL), {_NUL}"
        surrogate = _has_surrogate(item)
        return "the text has a lone UTF-16 surrogate, which is not Unicode text" if surrogate else None
    return f"a {type(item).__name__} is not JSON"


def _pointer_token(key: str) -> str:
    """A key as a JSON Pointer (RFC 6901) reference token, shortened for a message."""
    return key.replace("~", "~0").replace("/", "~1")[:60]
