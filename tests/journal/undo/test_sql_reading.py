"""The SQL an agent sends, read by each database's own grammar before anything is sent: reads pass, row
changes are known, everything else is named with what it would destroy, and the capture is never touched."""

import pytest

from journal.undo.database import judging, postgres, sqlite
from journal.undo.database.judging import Catalog

from .sql_corpus import SQLITE_SCHEMA, corpus


def reading(dialect: str, text: str):
    return postgres.read(text) if dialect == "postgresql" else sqlite.read(text, schema=SQLITE_SCHEMA)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_every_statement_of_the_corpus_is_read_as_its_kind(dialect):
    cases = corpus(dialect)
    assert len(cases) >= 500
    wrong = [(text, kind, reading(dialect, text).kind) for text, kind in cases
             if reading(dialect, text).kind != kind]
    assert wrong == []


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_no_write_is_ever_read_as_a_read(dialect):
    writes = [text for text, kind in corpus(dialect) if kind in ("rows", "destroy", "refused")]
    assert [text for text in writes if reading(dialect, text).kind == "read"] == []


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_a_drop_after_a_commit_sent_to_a_read_tool_is_a_drop_with_its_rows(dialect):
    read = reading(dialect, "SELECT 1; COMMIT; DROP TABLE contacts")
    assert read.kind == "destroy"
    assert read.worst.verb == "drops table contacts"
    assert [s.kind for s in read.statements] == ["read", "destroy", "destroy"]
    declaration = judging.declare(read, Catalog(counts={"contacts": 1196}))
    assert (declaration.kind, declaration.source) == ("none", "database")
    assert declaration.reason == "It drops table contacts: 1,196 rows."
    assert judging.to_count(read) == ("contacts",)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_row_changes_are_undoable_only_on_captured_tables_with_a_key(dialect):
    read = reading(dialect, "UPDATE contacts SET status = 'x' WHERE id < 40")
    keys = {"contacts": ("id",), "notes": ()}
    undoable = judging.declare(read, Catalog(keys=keys, captured=frozenset({"contacts"})))
    assert (undoable.kind, undoable.compensation.dialect, undoable.compensation.versioned) == (
        "compensate", "database", True)
    uncaptured = judging.declare(read, Catalog(keys=keys))
    assert uncaptured.kind == "none"
    assert uncaptured.reason.startswith("It updates rows of contacts, and contacts is not captured")
    keyless = judging.declare(reading(dialect, "DELETE FROM notes WHERE body = 'x'"),
                              Catalog(keys=keys, captured=frozenset({"notes"})))
    assert keyless.reason == ("It deletes rows of notes, and notes has no primary key, so its rows cannot be "
                              "told apart.")


def test_sqlite_names_the_tables_its_triggers_change():
    """A delete on contacts fires its audit trigger: audit's rows change too, and must be captured."""
    read = sqlite.read("DELETE FROM contacts WHERE id = 1", schema=SQLITE_SCHEMA)
    assert (read.kind, read.worst.writes, read.worst.triggers) == ("rows", ("contacts",), ("audit",))
    keys = {"contacts": ("id",), "audit": ("id",)}
    half = judging.declare(read, Catalog(keys=keys, captured=frozenset({"contacts"})))
    assert half.kind == "none" and "audit (through a trigger) is not captured" in half.reason
    whole = judging.declare(read, Catalog(keys=keys, captured=frozenset({"contacts", "audit"})))
    assert whole.kind == "compensate"


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_a_whole_table_delete_is_counted_before_it_runs(dialect):
    read = reading(dialect, "DELETE FROM contacts")
    assert read.kind == "rows" and read.worst.whole_table
    assert read.worst.verb == "deletes every row of contacts"
    uncaptured = judging.declare(read, Catalog(keys={"contacts": ("id",)}, counts={"contacts": 1196}))
    assert uncaptured.reason.startswith("It deletes every row of contacts (1,196 rows), and contacts is not "
                                        "captured")
    assert judging.to_count(read) == ("contacts",)
    assert not reading(dialect, "DELETE FROM contacts WHERE id = 1").worst.whole_table


def test_sqlite_replace_is_a_delete_no_trigger_sees():
    read = sqlite.read("INSERT OR REPLACE INTO contacts (id, email) VALUES (1, 'x')", schema=SQLITE_SCHEMA)
    assert read.kind == "destroy" and read.worst.replaces
    assert "no capture sees them go" in read.worst.reason


def test_touching_the_capture_is_refused_whatever_else_the_text_does():
    for read in (postgres.read("SELECT 1; ALTER TABLE contacts DISABLE TRIGGER ALL; DELETE FROM contacts"),
                 sqlite.read("SELECT 1; DROP TRIGGER _undo_capture_contacts_update", schema=SQLITE_SCHEMA)):
        assert read.kind == "refused"
        declaration = judging.declare(read, Catalog())
        assert declaration.kind == "none" and declaration.reason.startswith("Refused: it touches")


def test_dropping_a_captured_table_is_a_drop_not_a_touch():
    """Its capture triggers go with it: a person decides on the drop, like any other."""
    read = sqlite.read("DROP TABLE contacts", schema=SQLITE_SCHEMA)
    assert (read.kind, read.worst.destroys) == ("destroy", ("contacts",))


def test_text_the_grammar_cannot_read_is_unknown_with_its_words():
    pg = postgres.read("SELEC * FROM contacts")
    assert pg.kind == "unknown" and 'syntax error at or near "SELEC"' in pg.problem
    lite = sqlite.read("SELECT * FROM nowhere", schema=SQLITE_SCHEMA)
    assert lite.kind == "unknown" and "no such table: nowhere" in lite.problem
    assert judging.declare(pg, Catalog()).kind == "unknown"


def test_functions_the_catalogue_knows_to_change_nothing_are_reads():
    assert postgres.read("SELECT my_format(email) FROM contacts").kind == "destroy"
    assert postgres.read("SELECT my_format(email) FROM contacts", safe={"my_format"}).kind == "read"


def test_sqlite_compiles_a_table_the_text_creates_before_it_fills_it():
    read = sqlite.read("CREATE TABLE t9 (a); INSERT INTO t9 VALUES (1)", schema=SQLITE_SCHEMA)
    assert [(s.kind, s.verb) for s in read.statements] == [("destroy", "creates table t9"),
                                                            ("rows", "inserts rows into t9")]


def test_sqlite_never_runs_what_it_reads(tmp_path):
    """An ATTACH or VACUUM INTO would write a file where the Recorder runs: it is compiled, never run."""
    target = tmp_path / "copy.db"
    for text in (f"VACUUM INTO '{target}'", f"ATTACH DATABASE '{target}' AS other"):
        assert sqlite.read(text, schema=SQLITE_SCHEMA).kind == "destroy"
    assert not target.exists()


def test_the_record_keeps_each_statement_in_words():
    read = postgres.read("UPDATE contacts SET status = 'x' WHERE id = 1; DROP TABLE companies")
    assert read.as_record() == {"dialect": "postgresql", "kind": "destroy", "statements": [
        {"kind": "rows", "verb": "updates rows of contacts", "writes": ["contacts"],
         "text": "UPDATE contacts SET status = 'x' WHERE id = 1"},
        {"kind": "destroy", "verb": "drops table companies", "destroys": ["companies"],
         "text": "DROP TABLE companies",
         "reason": "it drops table companies: a table's definition and rows are not rows a capture can "
                   "put back"},
    ]}
    assert judging.summary(read) == "updates rows of contacts and drops table companies"
