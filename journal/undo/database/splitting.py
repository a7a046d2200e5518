"""How a database server cuts an agent's text into the statements it sends, so the Recorder reads what the
server will run, not what the text would be to the database alone. No ORM and no clock.

A pack says how its server cuts a text (`Recipe.split`):

- `database`: the server hands the whole text to the database, which cuts it by its own grammar
  (@modelcontextprotocol/server-postgres sends it as one simple query; mcp-server-sqlite's Python driver runs
  one statement and refuses a second), so the Recorder's reading by that grammar is what runs;
- `dbhub`: @bytebase/dbhub cuts the text itself, with a scanner of its own (`splitSQLStatements` in its
  `src/utils/sql-parser.ts`, ported below from the pinned 1.4.0), and sends each piece on its own. Where its
  scanner and the database's lexer disagree (PostgreSQL reads `$` inside an identifier as part of the name,
  DBHub's scanner as the start of a dollar quote), the pieces it sends are other statements than the
  database would read in the text: `SELECT 1 AS a$q$ -- $q$; DELETE FROM contacts` is one `SELECT` and a
  comment to PostgreSQL, and a `SELECT` then a `DELETE` through DBHub.

The port keeps DBHub's own rules character for character (its indices are JavaScript's UTF-16 code units,
but every rule compares ASCII characters only, so the cuts fall between the same characters), and
tests/journal/undo/test_sql_splitting.py drives generated texts through both, DBHub's own code in Node
included.
"""

import re
from collections.abc import Callable

from pglast import parse_sql
from pglast.stream import RawStream

from . import sqlite
from .reading import plural

DATABASE = "database"
DBHUB = "dbhub"
SPLITS = (DATABASE, DBHUB)

# JavaScript's `\w` is ASCII only.
_DOLLAR_OPEN = re.compile(r"\$([a-zA-Z_]\w*)?\$", re.ASCII)
# JavaScript's String.prototype.trim: white space and line terminators (ECMA-262 §22.1.3.32).
_JS_SPACE = ("\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
             "\u2028\u2029\u202f\u205f\u3000\ufeff")


def _line_comment(sql: str, i: int) -> int | None:
    if not sql.startswith("--", i):
        return None
    end = sql.find("\n", i)
    return len(sql) if end < 0 else end


def _block_comment(sql: str, i: int) -> int | None:
    if not sql.startswith("/*", i):
        return None
    end = sql.find("*/", i + 2)
    return len(sql) if end < 0 else end + 2


def _nested_comment(sql: str, i: int) -> int | None:
    if not sql.startswith("/*", i):
        return None
    j, depth = i + 2, 1
    while j < len(sql) and depth > 0:
        if sql.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif sql.startswith("*/", j):
            depth, j = depth - 1, j + 2
        else:
            j += 1
    return j


def _quoted(quote: str, close: str | None = None) -> Callable[[str, int], int | None]:
    """A block opened by `quote` and closed by `close` (the same by default), a doubled close escaping it."""
    close = close or quote

    def scan(sql: str, i: int) -> int | None:
        if sql[i] != quote:
            return None
        j = i + 1
        while j < len(sql):
            if sql[j] == close and j + 1 < len(sql) and sql[j + 1] == close:
                j += 2
            elif sql[j] == close:
                return j + 1
            else:
                j += 1
        return j

    return scan


def _dollar_quoted(sql: str, i: int) -> int | None:
    if sql[i] != "$" or (i + 1 < len(sql) and "0" <= sql[i + 1] <= "9"):
        return None
    found = _DOLLAR_OPEN.match(sql, i)
    if found is None:
        return None
    tag = found.group(0)
    close = sql.find(tag, i + len(tag))
    return len(sql) if close < 0 else close + len(tag)


_SINGLE, _DOUBLE = _quoted("'"), _quoted('"')
_SCANNERS = {
    "postgresql": (_line_comment, _nested_comment, _SINGLE, _DOUBLE, _dollar_quoted),
    "sqlite": (_line_comment, _block_comment, _SINGLE, _DOUBLE, _quoted("`"), _quoted("[", "]")),
}


def dbhub(sql: str, dialect: str) -> list[str]:
    """The pieces DBHub sends, in order, for `sql` on a database of `dialect` ("postgresql" or "sqlite")."""
    scanners = _SCANNERS[dialect]
    pieces, start, i, n = [], 0, 0, len(sql)
    while i < n:
        if sql[i] == ";":
            if piece := sql[start:i].strip(_JS_SPACE):
                pieces.append(piece)
            start = i = i + 1
            continue
        i = next((end for scan in scanners if (end := scan(sql, i)) is not None), i + 1)
    if piece := sql[start:].strip(_JS_SPACE):
        pieces.append(piece)
    return pieces


def pieces(sql: str, *, split: str, dialect: str) -> list[str]:
    """What the server sends to its database for `sql`: the whole text, or DBHub's pieces."""
    if split == DBHUB:
        return dbhub(sql, dialect)
    return [sql]


def _postgresql_statements(text: str) -> list[str] | None:
    """The statements PostgreSQL's grammar reads in `text`, each written out again by pglast (so that where
    a statement sits, and the comments and spaces around it, make no difference), or None when it cannot
    read them."""
    try:
        return [RawStream()(statement) for statement in parse_sql(text)]
    except Exception:  # noqa: BLE001 - any failure of the grammar or its printer: not read alike
        return None


def _sqlite_statements(text: str) -> list[str]:
    return [piece.strip().rstrip(";").strip() for piece in sqlite.statements(text)]


def disagreement(text: str, *, split: str, dialect: str) -> str | None:
    """Why the statements the server would send for `text` are not the statements the database's own grammar
    reads in it (then the Recorder's reading is not of what runs), or None when they are the same."""
    sent = pieces(text, split=split, dialect=dialect)
    if split == DATABASE:
        return None
    grammar = _postgresql_statements if dialect == "postgresql" else _sqlite_statements
    whole = grammar(text)
    if whole is None:  # the grammar cannot read the text: the reading says so (unknown)
        return None
    each = [grammar(piece) for piece in sent]
    if all(found is not None for found in each) and [s for found in each for s in found] == whole:
        return None
    database = "PostgreSQL" if dialect == "postgresql" else "SQLite"
    cut = (f"into {plural(len(sent), 'statement')} where {database} reads {plural(len(whole), 'statement')}"
           if len(sent) != len(whole) else f"into other statements than the {len(whole)} {database} reads")
    return (f"the server cuts this text {cut}, so what it would run is not what was read (a `$` inside a "
            "name, a quote or a comment that the two read differently, say); send statements that both read "
            "alike, one call each if need be")
