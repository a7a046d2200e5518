"""Strict JSON read whole (`strict_json`) and a member at a time (`json_stream`): the bytes-only depth count
agrees with a bracket-by-bracket reference on every JSON text, and the streamed reader refuses what the whole
reader refuses, whatever the chunk boundaries."""

import io
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.record import json_stream, strict_json

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def reference_depth(text: str) -> int:
    """Strings blanked by a regular expression, then every bracket counted in turn."""
    deepest = depth = 0
    for bracket in re.findall(rb"[\[\]{}]", _STRING.sub(b'""', text.encode("utf-8", "surrogatepass"))):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=30,
)
TRICKY_TEXT = st.text(alphabet='\\"[]{}ab', max_size=12)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES | st.lists(TRICKY_TEXT) | st.dictionaries(TRICKY_TEXT, TRICKY_TEXT), st.booleans())
def test_the_depth_of_every_json_text_is_the_bracket_by_bracket_count(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert strict_json.nesting_depth(text) == reference_depth(text)


@pytest.mark.parametrize("depth", [0, 1, 99, 100, 101, 250, 100_000])
def test_very_deep_and_unbalanced_texts_are_counted(depth):
    assert strict_json.nesting_depth("[" * depth + "]" * depth) == depth
    assert strict_json.nesting_depth('{"a": ' * depth + "1" + "}" * depth) == depth
    assert strict_json.nesting_depth("[" * depth) == depth  # cut short: still as deep as it went


class Trickle(io.RawIOBase):
    """A file that hands out at most `size` bytes a read, to put chunk boundaries everywhere."""

    def __init__(self, data: bytes, size: int):
        self._data, self._size = data, size

    def readable(self):
        return True

    def read(self, n=-1):
        piece, self._data = self._data[:self._size], self._data[self._size:]
        return piece


def streamed(data: bytes, *, size: int = 3, max_bytes: int = 10**6, max_depth: int = 10):
    reader = json_stream.ObjectStream(Trickle(data, size), max_bytes=max_bytes, max_depth=max_depth,
                                      what="the file")
    document = {}
    for key in reader.keys():
        document[key] = list(reader.items()) if key == "items" and reader.is_array() else reader.value()
    return document


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), VALUES, max_size=4), st.lists(VALUES, max_size=5),
       st.integers(1, 40), st.booleans())
def test_a_document_streamed_in_any_chunks_is_the_document(members, items, size, ascii_only):
    members = {**{k: v for k, v in members.items() if k != "items"}, "items": items}
    text = json.dumps(members, ensure_ascii=ascii_only, indent=1 if size % 2 else None)
    try:
        expected = strict_json.loads(text, max_bytes=10**6, max_depth=10)
    except strict_json.JsonRefused:
        with pytest.raises(strict_json.JsonRefused):
            streamed(text.encode("utf-8", "surrogatepass"), size=size)
        return
    assert streamed(text.encode("utf-8", "surrogatepass"), size=size) == expected


@pytest.mark.parametrize(("data", "problem"), [
    (b'{"a": 1, "a": 2}', "'a' appears twice"),
    (b'{"items": [{"b": 1, "b": 1}]}', "'b' appears twice"),
    (b'{"a": NaN}', "NaN is not a JSON number"),
    (b'{"a": 1} x', "more data after the end"),
    (b'{"a": 1', "expecting ',' or '}' at character 7"),
    (b'{"a": [1, 2}', "not JSON"),
    (b'{"items": [1, 2,]}', "not JSON: Expecting value at character 16"),
    (b'[1, 2]', "is not a JSON object"),
    (b'', "is not a JSON object"),
    (b'{"a": "\xff"}', "not UTF-8 text"),
    (b'{"a": "\xe2\x82"}', "not UTF-8 text"),
    (b'{"a": ' + b"[" * 11 + b"]" * 11 + b"}", "nests 12 levels deep; the limit is 10"),
    (b'{"items": [' + b"[" * 10 + b"]" * 10 + b"]}", "nests 12 levels deep; the limit is 10"),
    (b'{"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nests 50001 levels deep; the limit is 10"),
    (b'{"a": "' + b"x" * 200 + b'"}', "over 100 bytes"),
])
def test_what_the_stream_refuses_it_names(data, problem):
    with pytest.raises(strict_json.JsonRefused, match=re.escape(problem)):
        streamed(data, size=7, max_bytes=100 if b"x" * 200 in data else 10**6)


def test_a_number_cut_by_a_chunk_boundary_is_read_whole():
    assert streamed(b'{"items": [12345, 678], "n": 9012}', size=2) == {"items": [12345, 678], "n": 9012}


def test_a_member_not_read_is_passed_over():
    reader = json_stream.ObjectStream(io.BytesIO(b'{"skip": {"deep": [1]}, "keep": 2}'), max_bytes=100,
                                      max_depth=5)
    kept = {key: reader.value() for key in reader.keys() if key == "keep"}
    assert kept == {"keep": 2}
