"""Reading what the server will run (issue 58): DBHub cuts a text with a scanner of its own, and the Recorder
reads the pieces it sends, not the text. A differential test drives generated texts (quotes, dollar quotes
and `$` in names, nested comments, `E''` strings, brackets and backticks, semicolons in every context)
through DBHub's own code in Node, the Recorder's port of it and the database's own grammar: the port cuts
exactly as DBHub does, and every text DBHub would run otherwise than the database reads it is refused."""

import json
import random
import subprocess
from pathlib import Path

import pytest

from journal.undo.database import postgres, splitting, sqlite
from journal.undo.database.reading import as_run
from tests.services import needs_node

from .databases import NODE_22, SUITE_MODULES

DBHUB_DIST = SUITE_MODULES / "@bytebase/dbhub/dist"
SPLIT_SCRIPT = Path(__file__).with_name("dbhub_split.mjs")
SQLITE_SCHEMA = ["CREATE TABLE contacts (id INTEGER PRIMARY KEY, name TEXT)",
                 'CREATE TABLE "odd;name" (id INTEGER PRIMARY KEY)']

# Statements with a slot for a value, values and endings that each put a semicolon, a quote or a `$` in
# another context, and the separators between statements; and raw fragments, for texts that are not SQL.
STATEMENTS = ["SELECT {v}", "SELECT {v} FROM contacts", "SELECT id FROM contacts WHERE name = {v}",
              "DELETE FROM contacts WHERE name = {v}", "UPDATE contacts SET name = {v}", "SELECT {v}, {v}",
              "DROP TABLE contacts", "BEGIN", "COMMIT", "INSERT INTO contacts (name) VALUES ({v})"]
VALUES = ["1", "'a;b'", "'it''s; here'", "E'\\';'", "$$;$$", "$t$a;b$t$", "$q$x$q$", "1 AS a$q$",
          "a$q$", "\"odd;name\"", "\"a\"\"b;\"", "1 AS \"a$q$\"", "'$q$'", "'/*'", "'--'", "[a]", "`a`",
          "name"]
ENDINGS = ["", "", " -- c;", " -- $q$", " /* x; */", " /* /* n; */ s; */", " /* $q$ */", " -- a\n",
           " /* $q$; */", "\n-- $t$\n"]
SEPARATORS = [";", "; ", ";\n", " ;", ";;"]
FRAGMENTS = ["$q$", "$$", "$1", ";", "'", "\"", "/*", "*/", "--", "$", "$a", "a$", "[", "]", "`", "\n",
             "CREATE TRIGGER t AFTER INSERT ON contacts BEGIN DELETE FROM contacts; END"]


def generated(count: int, seed: int = 58) -> list[str]:
    chosen = random.Random(seed)

    def statement() -> str:
        text = chosen.choice(STATEMENTS)
        while "{v}" in text:
            text = text.replace("{v}", chosen.choice(VALUES), 1)
        return text + chosen.choice(ENDINGS)

    texts = []
    for number in range(count):
        parts = [statement() if number % 4 else chosen.choice(FRAGMENTS + VALUES)
                 for _ in range(chosen.randint(1, 4))]
        texts.append("".join(part + chosen.choice(SEPARATORS) for part in parts[:-1]) + parts[-1])
    return texts


def dbhub_cuts(texts: list[str], dialect: str) -> list[list[str]]:
    """Each text cut by DBHub's own splitSQLStatements (the pinned package, run by Node)."""
    payload = json.dumps([[text, "postgres" if dialect == "postgresql" else "sqlite"] for text in texts])
    done = subprocess.run([str(NODE_22), str(SPLIT_SCRIPT), str(DBHUB_DIST)], input=payload, text=True,
                          capture_output=True, check=True, timeout=120)
    return json.loads(done.stdout)


def reading_of(text: str, dialect: str):
    read = postgres.read(text) if dialect == "postgresql" else sqlite.read(text, schema=SQLITE_SCHEMA)
    problem = splitting.disagreement(text, split=splitting.DBHUB, dialect=dialect)
    return as_run(read, keeps_connection=True, split_problem=problem)


def statements_of(text: str, dialect: str) -> list[str] | None:
    if dialect == "postgresql":
        return splitting._postgresql_statements(text)
    return splitting._sqlite_statements(text)


@needs_node
@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_the_port_cuts_every_generated_text_exactly_as_dbhub_does(dialect):
    texts = generated(3000) + ["SELECT 1 AS a$q$ -- $q$; DELETE FROM contacts", "\ufeffSELECT 1;\u00a0",
                               "SELECT '\U0001f600;'; SELECT 2", "SELECT 1;\u2028SELECT 2"]
    assert [splitting.dbhub(text, dialect) for text in texts] == dbhub_cuts(texts, dialect)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_every_text_dbhub_would_run_otherwise_is_refused_and_every_other_is_read_as_the_database_reads_it(
        dialect):
    disagreed = agreed = 0
    for text in generated(3000, seed=59):
        whole = statements_of(text, dialect)
        if not whole:
            continue  # the grammar cannot read it, or it holds no statement: unknown, held (test_sql_reading)
        each = [statements_of(piece, dialect) for piece in splitting.dbhub(text, dialect)]
        same = all(found is not None for found in each) and [s for found in each for s in found] == whole
        reading = reading_of(text, dialect)
        if same:
            agreed += 1
            assert not reading.statements or reading.statements[0].verb != "is cut otherwise by its server", \
                text
        else:
            disagreed += 1
            assert reading.kind == "refused", text
            assert reading.statements[0].verb == "is cut otherwise by its server", text
    assert disagreed > 20 and agreed > 500  # the generator reaches both sides


def test_the_servers_that_hand_the_database_the_whole_text_are_read_as_the_database_reads_it():
    text = "SELECT 1 AS a$q$ -- $q$; DELETE FROM contacts"
    assert splitting.pieces(text, split=splitting.DATABASE, dialect="postgresql") == [text]
    assert splitting.disagreement(text, split=splitting.DATABASE, dialect="postgresql") is None
    assert postgres.read(text).kind == "read"  # one SELECT and a comment: what PostgreSQL runs
    assert reading_of(text, "postgresql").kind == "refused"  # and through DBHub, a DELETE too
