"""Runtime expressions (SEP-3172) and ChronoMCP paths, with RFC 6901's edge cases."""

import pytest

from journal.bindings import (
    BindingError,
    resolve_arguments,
    resolve_chronomcp_path,
    resolve_runtime_expression,
)

RFC6901_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", RFC6901_DOC), ("/foo", ["bar", "baz"]), ("/foo/0", "bar"), ("/", 0), ("/a~1b", 1), ("/c%d", 2),
        ("/e^f", 3), ("/g|h", 4), ("/i\\j", 5), ('/k"l', 6), ("/ ", 7), ("/m~0n", 8),
    ],
)
def test_rfc6901_examples_through_response_body(pointer, expected):
    assert (
        resolve_runtime_expression(f"$response.body#{pointer}", request={}, response=RFC6901_DOC) == expected
    )


def test_tilde_escapes_are_decoded_in_order():
    # "~01" is "~1" literally, not "/": RFC 6901 decodes ~1 first, then ~0.
    assert (
        resolve_runtime_expression("$response.body#/~01", request={}, response={"~1": "x", "/": "y"}) == "x"
    )


def test_request_body_reads_the_arguments():
    assert (
        resolve_runtime_expression("$request.body#/deal_id", request={"deal_id": "D-1"}, response={}) == "D-1"
    )


def test_literals_pass_through():
    assert resolve_runtime_expression(42, request={}, response={}) == 42
    assert resolve_runtime_expression("full", request={}, response={}) == "full"


@pytest.mark.parametrize(
    "expression",
    ["$response.body#/missing", "$response.body#/foo/7", "$response.body#foo", "$response.header.x",
     "$statusCode", "$response.body#/nothing", "$response.body#/foo/-"],
)
def test_unresolvable_expressions_are_errors(expression):
    with pytest.raises(BindingError):
        resolve_runtime_expression(expression, request={}, response={"foo": ["a"], "nothing": None})


def test_absent_structured_content_does_not_resolve():
    with pytest.raises(BindingError, match="absent"):
        resolve_runtime_expression("$response.body#/id", request={}, response=None)


def test_chronomcp_paths_walk_object_keys_only():
    result = {"structuredContent": {"id": "res_1", "items": [{"id": "x"}]}}
    assert resolve_chronomcp_path("$.output.structuredContent.id", request={}, response=result) == "res_1"
    assert resolve_chronomcp_path("$.input.sku", request={"sku": "S"}, response={}) == "S"
    for bad in [
        "$.output.structuredContent.items.0.id",
        "$.output",
        "$.elsewhere.id",
        "output.id",
        "$.output..id",
        7,
    ]:
        with pytest.raises(BindingError):
            resolve_chronomcp_path(bad, request={}, response=result)


def test_resolve_arguments_names_every_failed_binding_and_returns_nothing_partial():
    with pytest.raises(BindingError) as failure:
        resolve_arguments({"a": "$response.body#/a", "b": "$response.body#/b", "c": "$response.body#/c"},
                          dialect="sep3172", request={}, response={"a": 1})
    assert "b:" in str(failure.value) and "c:" in str(failure.value)


def test_resolve_arguments_resolves_all():
    assert resolve_arguments({"id": "$.output.structuredContent.id"}, dialect="chronomcp", request={},
                             response={"structuredContent": {"id": "r"}}) == {"id": "r"}
