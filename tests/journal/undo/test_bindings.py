"""Runtime expressions (SEP-3172) and ChronoMCP paths, with RFC 6901's edge cases."""

import pytest

from journal.undo.bindings import (
    BindingError,
    NothingToUndo,
    expression_problem,
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


# Recipes (issue 23): the earlier state the Recorder read before the call, and `*` over arrays.

CREATED = {"entities": [{"name": "Globex", "entityType": "company"}, {"name": "Ana", "entityType": "person"}]}


def test_a_recipe_binds_the_earlier_state_read_before_the_call():
    before = {"content": "line one\r\nline two\r\n"}
    assert resolve_runtime_expression("$before.body#/content", request={}, response={}, before=before) == (
        "line one\r\nline two\r\n")
    with pytest.raises(BindingError, match="the earlier state"):
        resolve_runtime_expression("$before.body#/content", request={}, response={})


def test_a_star_binds_every_element_of_an_array():
    assert resolve_runtime_expression("$response.body#/entities/*/name", request={}, response=CREATED) == [
        "Globex", "Ana"]
    # A key that is literally "*" in an object is that key, as RFC 6901 says.
    assert resolve_runtime_expression("$request.body#/*", request={"*": 1}, response=None) == 1


def test_an_empty_array_means_the_call_reports_nothing_to_undo():
    with pytest.raises(NothingToUndo, match="empty array"):
        resolve_arguments({"entityNames": "$response.body#/entities/*/name"}, dialect="recipe", request={},
                          response={"entities": []})
    # Mixed with a real failure, it is a binding that does not resolve.
    with pytest.raises(BindingError) as failed:
        resolve_arguments({"a": "$response.body#/entities/*/name", "b": "$request.body#/missing"},
                          dialect="recipe", request={}, response={"entities": []})
    assert not isinstance(failed.value, NothingToUndo)


def test_an_element_without_the_value_fails_the_whole_binding():
    with pytest.raises(BindingError, match="/entities/1"):
        resolve_runtime_expression("$response.body#/entities/*/name", request={},
                                   response={"entities": [{"name": "a"}, {"type": "b"}]})


@pytest.mark.parametrize(("expression", "problem"), [
    ("$request.body#/path", None), ("literal", None), ("$before.body#/content", None),
    ("$response.header#/x", "use one of"), ("$request.body#path", "not a JSON Pointer"),
])
def test_an_expression_is_checked_before_any_call(expression, problem):
    found = expression_problem(expression)
    assert found is None if problem is None else problem in found


def test_each_reshapes_every_element_of_an_array():
    added = {"results": [{"entityName": "Globex", "addedObservations": ["won", "kickoff booked"]},
                         {"entityName": "Ana", "addedObservations": ["buyer"]}]}
    binding = {"$each": "$response.body#/results",
               "as": {"entityName": "$item#/entityName", "observations": "$item#/addedObservations"}}
    assert resolve_arguments({"deletions": binding}, dialect="recipe", request={}, response=added) == {
        "deletions": [{"entityName": "Globex", "observations": ["won", "kickoff booked"]},
                      {"entityName": "Ana", "observations": ["buyer"]}]}
    with pytest.raises(NothingToUndo):
        resolve_arguments({"deletions": binding}, dialect="recipe", request={}, response={"results": []})
    assert expression_problem(binding) is None
    assert "exactly $each and as" in expression_problem({"$each": "$response.body#/results"})
    assert "use one of" in expression_problem({"$each": "$response.body#/results", "as": {"x": "$it#/a"}})


def test_a_match_binding_takes_what_one_group_captures_in_a_text():
    status = "Repository status:\nOn branch main\nnothing to commit"
    match = {"$match": "$before.body", "pattern": r"On branch (\S+)"}
    assert resolve_runtime_expression(match, request={}, response=None, before=status) == "main"
    with pytest.raises(BindingError, match="does not match"):
        resolve_runtime_expression(match, request={}, response=None, before="HEAD detached at 1a2b")
    assert expression_problem(match) is None
    assert "exactly 1 group" in expression_problem({"$match": "$before.body", "pattern": "x"})
    assert "not a regular expression" in expression_problem({"$match": "$before.body", "pattern": "("})
    assert "exactly $match and pattern" in expression_problem({"$match": "$before.body"})
    assert "use one of" in expression_problem({"$match": "$elsewhere", "pattern": "(x)"})
