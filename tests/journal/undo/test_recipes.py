"""Undo recipes (issue 23): an admin's declaration for a tool whose server declares nothing, keyed by the
tool's name and input-schema digest, never more permissive than the server's own declaration."""

import pytest

from journal.undo import declarations, recipe_chains, recipes

WRITE = {"name": "write_file", "inputSchema": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]},
    "annotations": {"readOnlyHint": False, "destructiveHint": True}}
READ = {"name": "read_text_file", "annotations": {"readOnlyHint": True},
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}}
LIST = {"name": "list_directory", "inputSchema": {"type": "object"}}
CATALOGUE = [WRITE, READ, LIST, {"name": "hatp_compensate", "inputSchema": {"type": "object"}}]


def restore(**overrides) -> dict:
    return {"tool": "write_file", "schemaDigest": recipes.schema_digest(WRITE), "kind": "compensate",
            "does": "restore the file's earlier content",
            "read": {"tool": "read_text_file", "arguments": {"path": "$request.body#/path"}},
            "version": "/content",
            "compensation": {"tool": "write_file", "arguments": {"path": "$request.body#/path",
                                                                  "content": "$before.body#/content"}},
            "whenReadFails": {"matches": "ENOENT", "reason": "The file did not exist: the call created it.",
                              "remedy": "Delete it by hand."},
            **overrides}


def recipe(**overrides) -> recipes.Recipe:
    parsed, problems = recipes.parse(restore(**overrides))
    assert parsed is not None, problems
    return parsed


def test_a_recipe_makes_a_silent_tool_undoable_and_a_person_signs_it():
    declared = recipes.declare(recipe(), WRITE, CATALOGUE)
    assert declared.kind == "compensate" and declared.source == "recipe" and declared.needs_human
    assert declared.compensation.tool == "write_file" and declared.compensation.dialect == "recipe"
    assert declared.compensation.bindings["content"] == "$before.body#/content"
    assert declared.model_dump(mode="json")["needs_human"] is True


@pytest.mark.parametrize(("raw", "problem"), [
    (restore(compensation=None), "names its compensation"),
    (restore(kind="none"), "has no compensation"),
    (restore(read=None), "need an earlier read"),
    (restore(version="content"), "not a JSON Pointer"),
    (restore(whenReadFails={"matches": "(", "reason": "x"}), "not a regular expression"),
    (restore(schemaDigest="abc"), "schemaDigest"),
    (restore(window="P1M"), "years and months"),
])
def test_a_malformed_recipe_is_refused_with_the_reason(raw, problem):
    parsed, problems = recipes.parse(raw)
    assert parsed is None and problem in " ".join(problems), problems


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"tool": "delete_file"}, "lists no tool 'delete_file'"),
    ({"schemaDigest": "0" * 64}, "no longer applies"),
    ({"read": {"tool": "list_directory", "arguments": {}}}, "does not say it is read-only"),
    ({"read": {"tool": "read_text_file", "arguments": {"path": "$request.body#/file"}}},
     "declares no argument 'file'"),
    ({"compensation": {"tool": "hatp_compensate", "arguments": {}}}, "not a tool of this server"),
    ({"compensation": {"tool": "write_file", "arguments": {"content": "$response.headers#/x"}}},
     "use one of"),
    ({"read": {"tool": "read_text_file", "arguments": {"path": "$before.body#/path"}}}, "use one of"),
])
def test_a_recipe_that_does_not_fit_its_servers_tools_says_why_and_the_call_is_unknown(overrides, problem):
    found = recipes.problems(recipe(**overrides), CATALOGUE)
    assert any(problem in p for p in found), found
    declared = recipes.declare(recipe(**overrides), WRITE, CATALOGUE)
    assert declared.kind == "unknown" and declared.source == "recipe"


def test_when_the_servers_schema_changes_the_recipe_no_longer_applies():
    changed = {**WRITE, "inputSchema": {**WRITE["inputSchema"], "properties": {
        **WRITE["inputSchema"]["properties"], "append": {"type": "boolean"}}}}
    declared = recipes.declare(recipe(), changed, [changed, READ])
    assert declared.kind == "unknown" and "no longer applies" in declared.problems[0]


def server(kind: str, source: str = "hatp/journal (tool)", **fields) -> declarations.UndoDeclaration:
    return declarations.UndoDeclaration(kind=kind, source=source, **fields)


def test_where_the_server_is_silent_or_only_hints_the_recipe_decides():
    for silent in (server("unknown", "none"), server("read_only", "annotations.readOnlyHint")):
        assert recipes.combine(silent, recipe(), WRITE, CATALOGUE).source == "recipe"


def test_a_recipe_never_makes_a_tool_more_permissive_than_its_server_says():
    irreversible = server("none", reason="delivered")
    assert recipes.combine(irreversible, recipe(), WRITE, CATALOGUE) == irreversible


def test_a_recipe_may_make_a_declaring_server_stricter():
    compensable = server("compensate", compensation=declarations.Compensation(tool="x", dialect="hatp"))
    never = recipe(kind="none", compensation=None, reason="We never undo this.")
    stricter = recipes.combine(compensable, never, WRITE, CATALOGUE)
    assert stricter.kind == "none" and stricter.source == "recipe"
    assert stricter.reason == "We never undo this."
    signed = recipes.combine(compensable, recipe(), WRITE, CATALOGUE)
    assert signed.source == "hatp/journal (tool)" and signed.needs_human
    assert recipes.combine(compensable, recipe(needsHuman=False), WRITE, CATALOGUE) == compensable


def test_the_version_is_the_digest_of_what_the_read_returns():
    first = {"content": [{"type": "text", "text": "a"}], "structuredContent": {"content": "a\r\n"}}
    again = {"content": [], "structuredContent": {"content": "a\r\n"}}
    assert recipes.version(first, "/content") == recipes.version(again, "/content")
    assert recipes.version(first, "/content") != recipes.version(
        {"structuredContent": {"content": "a\n"}}, "/content")  # line endings count
    for broken in ({"isError": True, "content": []}, {"content": []}, {"structuredContent": {}}):
        with pytest.raises(ValueError):
            recipes.version(broken, "/content")


@pytest.mark.parametrize(("now", "state"), [("after", "ok"), ("before", "undone"), ("other", "conflict")])
def test_a_recipe_check_is_three_state(now, state):
    assert recipes.three_state(before="before", after="after", now=now) == state


def test_a_call_that_left_the_state_as_it_found_it_has_nothing_to_undo():
    assert recipes.three_state(before="same", after="same", now="same") == "unchanged"


def test_a_graph_read_compares_as_sets_when_the_recipe_says_order_means_nothing():
    one = {"structuredContent": {"entities": [{"name": "a", "observations": ["x", "y"]}, {"name": "b"}]}}
    other = {"structuredContent": {"entities": [{"name": "b"}, {"name": "a", "observations": ["y", "x"]}]}}
    assert recipes.version(one, ignore_order=True) == recipes.version(other, ignore_order=True)
    assert recipes.version(one) != recipes.version(other)


def test_a_server_that_answers_in_text_is_versioned_by_its_text():
    staged = {"content": [{"type": "text", "text": "diff --git a/a.txt b/a.txt"}]}
    same = {"content": [{"type": "text", "text": "diff --git a/a.txt b/a.txt"}], "isError": False}
    assert recipes.version(staged) == recipes.version(same)
    with pytest.raises(ValueError):
        recipes.version(staged, "/content")


def test_an_earlier_state_the_compensation_cannot_put_back_is_refused():
    rule = {"at": "/content", "matches": "\ufffd", "reason": "not text"}
    binary = recipe(refuseIfBefore=rule)
    assert recipes.unrestorable(binary, {"content": "PNG\ufffd\ufffd"}).reason == "not text"
    assert recipes.unrestorable(binary, {"content": "plain"}) is None
    assert recipes.unrestorable(recipe(), {"content": "PNG\ufffd"}) is None


def test_further_compensating_calls_are_kept_in_order_and_checked():
    then = [{"tool": "write_file", "arguments": {"path": "$request.body#/path", "content": ""}}]
    declared = recipes.declare(recipe(then=then), WRITE, CATALOGUE)
    assert declared.compensation.then == ({"tool": "write_file", "bindings": then[0]["arguments"]},)
    assert declared.model_dump(mode="json")["compensation"]["then"][0]["tool"] == "write_file"
    assert "then" not in recipes.declare(recipe(), WRITE, CATALOGUE).model_dump(mode="json")["compensation"]
    missing = recipe(then=[{"tool": "delete_file", "arguments": {}}])
    assert "'delete_file' is not a tool of this server" in " ".join(recipes.problems(missing, CATALOGUE))


def test_a_failed_read_means_what_the_recipe_says_or_nothing():
    rule = recipes.failed_read(recipe(), "Error: ENOENT: no such file or directory, open '/tmp/new.txt'")
    assert rule is not None and rule.kind == "none" and rule.remedy == "Delete it by hand."
    assert recipes.failed_read(recipe(), "Error: EACCES: permission denied") is None


def test_where_the_run_left_a_record_follows_its_later_calls_that_found_it_where_the_last_left_it():
    assert recipe_chains.left_by_the_run("b", [("b", "c"), ("x", "y"), ("c", "d")]) == "d"
    assert recipe_chains.left_by_the_run("b", [("z", "c")]) == "b"  # someone else's change between: no chain
    one = {"tool": "read_text_file", "arguments": {"path": "/a"}, "version": "v"}
    assert recipe_chains.read_key(one) == recipe_chains.read_key({**one, "version": "w"})
    assert recipe_chains.read_key({"tool": "read_text_file", "arguments": {"path": "/a"}}) == ""  # no version


def test_two_reads_overlap_when_the_same_read_names_something_in_common():
    ann = {"tool": "open_nodes", "arguments": {"names": ["Ann", "Bob"]}}
    assert recipe_chains.reads_overlap(ann, {"tool": "open_nodes", "arguments": {"names": ["Ann"]}})
    assert not recipe_chains.reads_overlap(ann, {"tool": "open_nodes", "arguments": {"names": ["Cy"]}})
    assert not recipe_chains.reads_overlap({"tool": "read_text_file", "arguments": {"path": "/a"}},
                                     {"tool": "read_text_file", "arguments": {"path": "/b"}})
    assert not recipe_chains.reads_overlap(ann, {"tool": "read_text_file", "arguments": {"path": "Ann"}})
    assert not recipe_chains.reads_overlap(ann, None)


@pytest.mark.parametrize("pattern", [r"(?<=x)(y)", r"(a)\1", "(x{2000})"])
def test_a_pattern_re2_will_not_run_is_refused_when_the_recipe_is_saved(pattern):
    """Issue 43, finding 8: recipes' patterns run by RE2 (linear time); what RE2 refuses (look-around,
    backreferences, huge repetitions) is refused at save, saying why, never at the agent's call."""
    from journal.undo.bindings import expression_problem

    recipe = {"tool": "t", "schemaDigest": "0" * 64, "kind": "compensate", "versionPattern": pattern,
              "read": {"tool": "r", "arguments": {}}, "compensation": {"tool": "t", "arguments": {}}}
    parsed, problems = recipes.parse(recipe)
    assert parsed is None and any("RE2" in problem for problem in problems), problems
    assert "RE2" in expression_problem({"$match": "$before.body", "pattern": pattern})


def test_a_pattern_runs_on_bounded_text_and_never_on_a_lone_surrogate():
    from journal.undo import patterns

    assert patterns.search(r"(x)", "x" * patterns.TEXT_LIMIT).group(1) == "x"
    assert patterns.search(r"(x)", "x" * (patterns.TEXT_LIMIT + 1)) is None
    assert patterns.search(r"(x)", "\ud800x") is None and patterns.search(r"(x)", 7) is None
