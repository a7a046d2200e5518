"""RFC 8785 (JCS) through the library we use, with the RFC's own test vectors, and our I-JSON guard."""

import struct

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.record.canonical import _plain, _rewritten, canonical_bytes, from_jsonb, loads_record, to_ijson


def test_rfc8785_section_3_2_2_example_is_reproduced():
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_bytes(value) == expected.encode()


def test_rfc8785_section_3_2_3_property_sorting_uses_utf16_code_units():
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = [key for key in __import__("json").loads(canonical_bytes(value))]
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize(
    ("ieee_hex", "expected"),
    [
        ("0000000000000000", "0"),
        ("8000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("8000000000000001", "-5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("ffefffffffffffff", "-1.7976931348623157e+308"),
        ("4340000000000000", "9007199254740992"),
        ("c340000000000000", "-9007199254740992"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("44b52d02c7e14af7", "1.0000000000000001e+23"),
        ("444b1ae4d6e2ef4e", "999999999999999700000"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("41b3de4355555553", "333333333.3333332"),
        ("41b3de4355555554", "333333333.33333325"),
        ("41b3de4355555555", "333333333.3333333"),
        ("41b3de4355555556", "333333333.3333334"),
        ("41b3de4355555557", "333333333.33333343"),
        ("becbf647612f3696", "-0.0000033333333333333333"),
        ("43143ff3c1cb0959", "1424953923781206.2"),
    ],
)
def test_rfc8785_appendix_b_numbers(ieee_hex, expected):
    (number,) = struct.unpack(">d", bytes.fromhex(ieee_hex))
    assert canonical_bytes(number) == expected.encode()


def test_integers_beyond_ijson_become_strings_before_hashing():
    assert to_ijson({"n": 2**60, "ok": 2**53 - 1}) == {"n": str(2**60), "ok": 2**53 - 1}


def test_lone_surrogates_become_replacement_characters():
    assert canonical_bytes(to_ijson("a\ud800b")) == '"a\ufffdb"'.encode()


def test_non_finite_floats_are_kept_as_words():
    assert to_ijson([float("nan"), float("inf")]) == ["nan", "inf"]


I_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(), children, max_size=6),
    max_leaves=40,
)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(I_JSON)
def test_the_fast_path_writes_exactly_the_librarys_bytes_for_every_i_json_value(value):
    assert canonical_bytes(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("value", [
    {"durationMs": 9.123, "seq": 12, "data": {"text": "Proposal → Won\n\t\u0001\"\\", "ok": True, "n": None}},
    [1, -(2**53 - 1), "x", {"": []}],
])
def test_a_journal_entrys_usual_values_take_the_fast_path(value):
    assert _plain(value) and canonical_bytes(value) == rfc8785.dumps(value)


@pytest.mark.parametrize("value", [
    1e-7, 1e21, 1.0, -0.0, 1e16, {"\U0001f600": 1, "\ufb33": 2}, 2**53, (1, 2),
])
def test_what_the_fast_path_might_write_differently_goes_to_the_library(value):
    assert not _plain(value)


# Anything a server or an agent may send once parsed, and what a caller may hand over: lone surrogates and
# U+0000 in texts and keys, integers of any size, NaN and infinities, tuples.
ANY_TEXT = st.text(st.characters(blacklist_categories=()), max_size=12)
ANYTHING = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda children: st.lists(children, max_size=5) | st.tuples(children)
    | st.dictionaries(ANY_TEXT, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANYTHING)
def test_a_value_the_record_keeps_as_it_is_is_given_back_and_anything_else_rewritten(value):
    kept, rewritten = to_ijson(value), _rewritten(value)
    assert repr(kept) == repr(rewritten)  # the same values, of the same types
    assert canonical_bytes(kept) == rfc8785.dumps(kept)


def test_a_lone_surrogate_is_refused_as_the_library_refuses_it():
    for value in ("a\ud800", {"k": ["\udfff"]}):
        with pytest.raises(rfc8785.CanonicalizationError):
            canonical_bytes(value)


def test_a_value_nested_deeper_than_the_compiled_encoder_goes_is_written_by_the_library():
    value = [1.5]
    for _ in range(300):
        value = [{"a": value}]
    assert canonical_bytes(value) == rfc8785.dumps(value)


def test_a_float_jsonb_gave_back_as_an_integer_is_a_float_again():
    # PostgreSQL's jsonb keeps 1e21's value, not its form; nothing is stored as an integer that big.
    stored = {"big": 10**21, "safe": 2**53 - 1, "nested": [{"tiny": 1e-06, "n": -(10**22)}], "s": "1e21"}
    restored = from_jsonb(stored)
    assert restored == {"big": 1e21, "safe": 2**53 - 1, "nested": [{"tiny": 1e-06, "n": -1e22}], "s": "1e21"}
    assert type(restored["big"]) is float and type(restored["safe"]) is int
    assert canonical_bytes(restored) == (
        b'{"big":1e+21,"nested":[{"n":-1e+22,"tiny":0.000001}],"s":"1e21","safe":9007199254740991}')


RECORD_NUMBERS = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RECORD_NUMBERS)
def test_record_text_is_read_as_from_jsonb_gives_it_back(value):
    import json

    text = json.dumps(value)
    read, expected = loads_record(text), from_jsonb(json.loads(text))
    assert read == expected and repr(read) == repr(expected)  # the same values, of the same types


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(), I_JSON, max_size=8))
def test_an_object_joined_from_its_members_written_apart_is_the_librarys_bytes(value):
    from journal.record.canonical import joined, members

    assert joined(members(value)) == rfc8785.dumps(value)
