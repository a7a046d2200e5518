"""One JSON object read from a file a member at a time, and an array member an item at a time, so a document
of any length is read in memory bounded by its largest item, not by its length (a run bundle of a million
entries).

It is read as strictly as `strict_json.loads` reads a whole text: at most `max_bytes`, no value nested more
than `max_depth` levels (counted from the document's top), no key twice in an object, no NaN or Infinity,
UTF-8 only. Each value is parsed by the standard library's own decoder (`raw_decode`) over a buffer that
grows when a value does not fit and drops what has been read.
"""

import codecs
import json
from collections.abc import Iterator
from typing import IO, Any

from .strict_json import JsonRefused, nesting_depth, no_constants, no_duplicates

_CHUNK = 1 << 20
_SPACE = " \t\n\r"


class ObjectStream:
    """Read `for key in stream.keys()`; for each key, call `value()` or `items()` (or neither: the value is
    then read and dropped), and the next key follows. Every refusal is a `JsonRefused` naming where."""

    def __init__(self, source: IO, *, max_bytes: int, max_depth: int, what: str = "the document") -> None:
        self._source, self._max_bytes, self._max_depth, self._what = source, max_bytes, max_depth, what
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        decoder = json.JSONDecoder(object_pairs_hook=no_duplicates, parse_constant=no_constants)
        self._decode = decoder.raw_decode
        self._buf, self._pos, self._offset, self._bytes, self._eof = "", 0, 0, 0, False
        self._chunk = _CHUNK
        self._consumed = True

    # -- the document's shape --------------------------------------------------------------------------

    def keys(self) -> Iterator[str]:
        """The top-level object's keys in order; refuses a key twice, and anything after the object."""
        if self._peek() != "{":
            raise JsonRefused(f"{self._what} is not a JSON object")
        self._pos += 1
        seen: set[str] = set()
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                key = self._value(around=1)
                if not isinstance(key, str):
                    raise self._refused("an object key must be a string")
                if key in seen:
                    raise JsonRefused(f"the key {key[:80]!r} appears twice in one object")
                seen.add(key)
                self._expect(":", "':' after a key")
                self._consumed = False
                yield key
                if not self._consumed:
                    self.value()
                if self._separator("}"):
                    break
        if self._peek() != "":
            raise self._refused("more data after the end of the document")

    def value(self) -> Any:
        """The current key's value, parsed whole."""
        self._consumed = True
        return self._value(around=1)

    def is_array(self) -> bool:
        """Whether the current key's value is an array (so `items` may read it)."""
        return self._peek() == "["

    def items(self) -> Iterator[Any]:
        """The current key's value, an array, one item at a time."""
        self._consumed = True
        self._expect("[", "an array")
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            yield self._value(around=2)
            if self._separator("]"):
                return

    # -- reading -------------------------------------------------------------------------------------------

    def _value(self, *, around: int) -> Any:
        """The value at the read position, inside `around` levels of the document (1 for a member's)."""
        self._peek()
        while True:
            start = self._pos
            try:
                value, end = self._decode(self._buf, start)
            except RecursionError:
                while self._more():  # to say how deep it goes (what follows it only counts if deeper)
                    pass
                raise self._too_deep(nesting_depth(self._buf[self._pos:]) + around) from None
            except json.JSONDecodeError as exc:
                if self._more(grow=True):  # the value may only go on past the buffer
                    continue
                raise self._refused(exc.msg, at=exc.pos) from None
            if type(value) in (int, float) and self._number_may_go_on(end) and self._more():
                continue
            break
        self._chunk = _CHUNK
        span = self._buf[start:end]
        if span.count("[") + span.count("{") > self._max_depth - around:
            depth = nesting_depth(span) + around
            if depth > self._max_depth:
                raise self._too_deep(depth)
        self._pos = end
        return value

    def _number_may_go_on(self, end: int) -> bool:
        """Whether a number read up to `end` may go on in the next chunk ("12" of "1234", "0" of "0.5")."""
        rest = len(self._buf) - end
        return rest == 0 or (rest <= 2 and not self._buf[end:].strip(".eE+-"))

    def _peek(self) -> str:
        """The next character that is not white space ("" at the end), without reading past it."""
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in _SPACE:
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return ""

    def _expect(self, char: str, what: str) -> None:
        if self._peek() != char:
            raise self._refused(f"expecting {what}", at=self._pos)
        self._pos += 1

    def _separator(self, close: str) -> bool:
        """Past a ',' (False) or the closing bracket (True)."""
        char = self._peek()
        if char in (",", close):
            self._pos += 1
            return char == close
        raise self._refused(f"expecting ',' or {close!r}", at=self._pos)

    def _more(self, *, grow: bool = False) -> bool:
        """Read another chunk onto the buffer (dropping what has been read); False at the end. With `grow`
        (a value did not fit), each chunk is twice the last, so a long value is not parsed over and over."""
        if self._eof:
            return False
        chunk = self._source.read(self._chunk)
        if grow:
            self._chunk = min(self._chunk * 2, 64 * _CHUNK)
        if isinstance(chunk, str):
            self._bytes += len(chunk.encode("utf-8", errors="surrogatepass"))
            text = chunk
        else:
            self._bytes += len(chunk)
            try:
                text = self._decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise JsonRefused(f"{self._what} is not UTF-8 text ({exc.reason} near byte "
                                  f"{self._bytes - len(chunk) + exc.start})") from None
        if self._bytes > self._max_bytes:
            raise JsonRefused(f"{self._what} is over {self._max_bytes} bytes, the limit")
        if not chunk:
            self._eof = True
            return False  # the buffer stays as it is: a caller may still hold positions in it
        self._offset += self._pos
        self._buf = self._buf[self._pos:] + text
        self._pos = 0
        return True

    def _refused(self, problem: str, *, at: int | None = None) -> JsonRefused:
        where = f" at character {self._offset + at}" if at is not None else ""
        return JsonRefused(f"{self._what} is not JSON: {problem}{where}")

    def _too_deep(self, depth: int) -> JsonRefused:
        return JsonRefused(f"{self._what} nests {depth} levels deep; the limit is {self._max_depth}")
