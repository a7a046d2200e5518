"""How a recipe's undo reads to people: one call in one line, and a conflict three ways
(journal.undo.recipe_text)."""

from journal.undo.recipe_text import brief, size, three_way


def test_a_call_in_one_line_shows_paths_and_gives_long_text_by_its_size():
    line = brief("write_file", {"path": "/srv/notes/todo.md", "content": "x" * 1200})
    assert line == 'write_file {path: "/srv/notes/todo.md", content: 1.2 kB}'
    assert brief("write_file", {"content": "a\nb"}) == "write_file {content: 3 B}"  # text: its size
    assert brief("delete_entities", {"entityNames": [f"entity {n}" for n in range(20)]}) == (
        "delete_entities {entityNames: [20 items]}")
    assert brief("delete_entities", {"entityNames": ["Ann"]}) == 'delete_entities {entityNames: ["Ann"]}'
    assert size("é" * 600) == "1.2 kB" and size("x" * 3_400_000) == "3.4 MB"


def test_a_files_conflict_is_two_line_diffs_what_the_agent_changed_and_what_changed_since():
    shown = three_way({"content": "a\nb\n"}, {"content": "a\nB\n"}, {"content": "a\nB\nc\n"})["text"]
    assert shown["agent"][:2] == ["--- before the agent", "+++ as the agent left it"]
    assert "-b" in shown["agent"] and "+B" in shown["agent"]
    assert shown["since"][:2] == ["--- as the agent left it", "+++ now"] and "+c" in shown["since"]


def test_without_what_the_agent_left_the_change_since_is_against_before_the_agent():
    shown = three_way({"content": "a\n"}, None, {"content": "z\n"})["text"]
    assert "agent" not in shown and shown["since"][0] == "--- before the agent"


def test_a_records_conflict_is_a_field_diff_by_name_with_lists_of_plain_values_as_sets():
    before = {"entities": [{"name": "Ann", "observations": ["likes tea"]}]}
    left = {"entities": [{"name": "Ann", "observations": ["likes tea", "on call"]}]}
    now = {"entities": [{"name": "Ann", "observations": ["on call", "likes tea", "moved"]},
                        {"name": "Bob", "observations": []}]}
    rows = {row["field"]: row for row in three_way(before, left, now)["fields"]}
    # Issue 44, finding 3: the rows are the record's fields in words, and a list of values reads as one.
    assert rows["Ann › observations"] == {
        "field": "Ann › observations", "before": "likes tea", "left": "likes tea; on call",
        "now": "likes tea; moved; on call"}
    assert rows["Bob › name"]["before"] == "(absent)" and rows["Bob › name"]["now"] == "Bob"
    assert rows["Bob › observations"]["now"] == "(none)"
    # Relations (records with no name) are a set of lines.
    knows = {"from": "Ann", "to": "Bob", "relationType": "knows"}
    related = three_way({"relations": []}, {"relations": [knows]}, {"relations": []})["fields"]
    assert related == [{"field": "relations", "before": "(none)", "left": "Ann Bob knows", "now": "(none)"}]
    # Order alone is no change.
    reordered = {"entities": [{"name": "Ann", "observations": ["on call", "likes tea"]}]}
    assert three_way(left, left, reordered) == {"fields": []}


def test_a_huge_conflict_is_bounded():
    many = three_way({f"k{n}": n for n in range(100)}, None, {f"k{n}": n + 1 for n in range(100)})
    assert len(many["fields"]) == 40 and many["more"] == 60
    assert all(row["left"] == "(not kept)" for row in many["fields"])
    text = three_way({"content": "\n".join(map(str, range(1000)))}, None,
                     {"content": "\n".join(f"{n}!" for n in range(1000))})["text"]["since"]
    assert len(text) == 81 and text[-1].startswith("… ")
    long = three_way({"k": "x" * 5000, "n": 1}, None, {"k": "y", "n": 1})["fields"][0]
    assert len(long["before"]) == 201


def test_how_long_after_the_agent_a_record_changed_reads_in_words():
    from datetime import UTC, datetime

    from journal.undo.recipe_text import after_the_agent

    agent = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert after_the_agent("2026-11-29T10:12:40Z", agent) == "12 minutes after the agent's change"
    assert after_the_agent("2026-11-29T11:00:00+00:00", agent) == "1 hour after the agent's change"
    assert after_the_agent("2026-11-29T10:00:20Z", agent) == "less than a minute after the agent's change"
    assert after_the_agent("2026-11-29T09:00:00Z", agent) == "before the agent's change"
    assert after_the_agent("yesterday", agent) == after_the_agent("2026-11-29T10:12:00", agent) == ""
    assert after_the_agent(None, agent) == after_the_agent("2026-11-29T10:12:00Z", None) == ""


def test_a_three_way_rows_changed_cells_are_the_agents_and_those_since():
    from journal.undo.fields import marks

    assert marks({"before": "Proposal", "left": "Won", "now": "Won"}) == {"agent": True, "since": False}
    assert marks({"before": "48000", "left": "48000", "now": "45000"}) == {"agent": False, "since": True}
    assert marks({"before": "a", "left": "(not kept)", "now": "b"}) == {"agent": False, "since": True}
    assert marks({"before": "(not given)", "left": "(not given)", "now": "1"}) == {"agent": False,
                                                                                  "since": False}


def test_a_change_of_line_endings_alone_shows_in_the_diff():
    """Issue 43, finding 9: the diff compared lines without their ends, so CRLF for LF, a dropped final
    newline or a U+2028 showed as no change at all."""
    crlf = three_way({"content": "a\nb\n"}, None, {"content": "a\r\nb\r\n"})["text"]["since"]
    assert "-a" in crlf and "+a⟨CR LF⟩" in crlf
    final = three_way({"content": "a\n"}, None, {"content": "a"})["text"]["since"]
    assert "+a⟨no line end⟩" in final
    separator = three_way({"content": "a b\n"}, None, {"content": "a\u2028b\n"})["text"]["since"]
    assert "+a⟨U+2028⟩" in separator


def test_a_field_that_differs_only_past_the_cut_is_shown_from_where_it_differs():
    long = "x" * 500
    row = three_way({"k": long + "A", "n": 1}, None, {"k": long + "B", "n": 1})["fields"][0]
    assert row["before"] != row["now"]
    assert row["before"].startswith("…") and "xA" in row["before"] and "xB" in row["now"]
    from journal.undo.recipe_text import field_changes

    [changed] = field_changes({"note": long + "1"}, {"note": long + "2"}, {"note": long + "2"})["fields"]
    assert changed["before"].endswith("x1") and changed["left"].endswith("x2")
