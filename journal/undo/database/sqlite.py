"""SQLite's SQL read by SQLite itself: the text split where SQLite ends a statement
(`sqlite3.complete_statement`), and each statement compiled, never run, against an in-memory copy of the
database's schema with an authorizer that hears every action it would take, its triggers' included
(`reading`). The agent's text is only ever compiled (`EXPLAIN`); the copy takes the text's own schema
changes (a table it creates, then fills) so that what follows compiles as it would on the database."""

import secrets
import sqlite3
from collections.abc import Sequence

from .reading import SQLITE_PREFIX, Reading, Statement, named, transaction_control_among_others

A = sqlite3  # the authorizer's action codes
READ_ACTIONS = {A.SQLITE_READ, A.SQLITE_SELECT, A.SQLITE_RECURSIVE}
ROW_ACTIONS = {A.SQLITE_INSERT: "inserts rows into", A.SQLITE_UPDATE: "updates rows of",
               A.SQLITE_DELETE: "deletes rows of"}
SCHEMA_ACTIONS = {
    A.SQLITE_CREATE_TABLE: "creates table", A.SQLITE_CREATE_TEMP_TABLE: "creates temporary table",
    A.SQLITE_CREATE_INDEX: "creates index", A.SQLITE_CREATE_TEMP_INDEX: "creates index",
    A.SQLITE_CREATE_VIEW: "creates view", A.SQLITE_CREATE_TEMP_VIEW: "creates view",
    A.SQLITE_CREATE_TRIGGER: "creates trigger", A.SQLITE_CREATE_TEMP_TRIGGER: "creates trigger",
    A.SQLITE_DROP_TABLE: "drops table", A.SQLITE_DROP_TEMP_TABLE: "drops temporary table",
    A.SQLITE_DROP_INDEX: "drops index", A.SQLITE_DROP_TEMP_INDEX: "drops index",
    A.SQLITE_DROP_VIEW: "drops view", A.SQLITE_DROP_TEMP_VIEW: "drops view",
    A.SQLITE_DROP_TRIGGER: "drops trigger", A.SQLITE_DROP_TEMP_TRIGGER: "drops trigger",
    A.SQLITE_ALTER_TABLE: "alters table", A.SQLITE_CREATE_VTABLE: "creates virtual table",
    A.SQLITE_DROP_VTABLE: "drops virtual table", A.SQLITE_ATTACH: "attaches database file",
    A.SQLITE_DETACH: "detaches database", A.SQLITE_ANALYZE: "analyzes", A.SQLITE_REINDEX: "reindexes",
}
TRANSACTION_WORDS = {"BEGIN": "begins a transaction", "COMMIT": "commits the transaction",
                     "ROLLBACK": "rolls the transaction back"}
# Pragmas that only read, with or without an argument (a table's name, most of them).
READ_PRAGMAS = frozenset("""
table_info table_xinfo table_list index_list index_info index_xinfo foreign_key_list foreign_key_check
database_list collation_list function_list module_list pragma_list compile_options integrity_check
quick_check page_count freelist_count data_version encoding schema_version user_version application_id
page_size journal_mode foreign_keys recursive_triggers busy_timeout cache_size synchronous
""".split())
# Pragmas that, set, reach the capture: a schema anyone may edit by hand, triggers that stop firing.
CAPTURE_PRAGMAS = frozenset({"writable_schema", "trusted_schema"})
SIDE_EFFECT_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
PROBE = "_undo_probe_"  # the copy's delete triggers that hear a row replaced on a conflict (`Copy._probe`)
WORDS_AFTER = {"VACUUM": "vacuums the database (VACUUM INTO writes a copy to a file)",
               "REINDEX": "reindexes", "ANALYZE": "analyzes"}


def statements(text: str) -> list[str]:
    """`text` cut where SQLite ends each statement; what is left over is one more (incomplete) statement."""
    pieces, start = [], 0
    for index, char in enumerate(text):
        if char == ";" and sqlite3.complete_statement(text[start:index + 1]):
            pieces.append(text[start:index + 1])
            start = index + 1
    if text[start:].strip():
        pieces.append(text[start:])
    return [p for p in pieces if not _blank(p)]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _blank(piece: str) -> bool:
    """Nothing but blanks, comments and semicolons."""
    index, n = 0, len(piece)
    while index < n:
        if piece[index].isspace() or piece[index] == ";":
            index += 1
        elif piece.startswith("--", index):
            end = piece.find("\n", index)
            index = n if end < 0 else end + 1
        elif piece.startswith("/*", index):
            end = piece.find("*/", index + 2)
            index = n if end < 0 else end + 2
        else:
            return False
    return True


def _first_word(piece: str) -> str:
    words = piece
    while True:
        words = words.lstrip()
        if words.startswith("--"):
            words = words.partition("\n")[2]
        elif words.startswith("/*"):
            words = words.partition("*/")[2]
        else:
            break
    return (words.split(None, 1) or [""])[0].rstrip(";").upper()


class Copy:
    """An in-memory copy of the schema, and the actions the last statement compiled there would take. One
    copy may serve many readings, one at a time (`shared`: from any thread): what a text applies to it is
    rolled back after."""

    def __init__(self, schema: Sequence[str], *, shared: bool = False):
        # No statement cache: a cached statement is not compiled again, so the authorizer would hear nothing
        # the second time a text is read (and a refused text would read as a read).
        self.connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=not shared,
                                          cached_statements=0)
        for statement in schema:
            try:
                self.connection.execute(statement)
            except sqlite3.Error:
                continue  # an object of a kind the copy cannot hold (a virtual table's module, say)
        self.probes = self._probe()
        self.actions: list[tuple] = []
        self.applying = False
        self.connection.set_authorizer(self._heard)

    def _probe(self) -> dict[str, str]:
        """A delete trigger on each table of the copy, and recursive triggers on: SQLite then compiles the
        delete triggers of every row a statement may replace on a conflict (its own OR REPLACE in any
        spelling, or a table's declared ON CONFLICT REPLACE), so the authorizer hears a probe's body where
        the database would delete rows without telling its triggers. {probe's name: its table}."""
        probes, prefix = {}, f"{PROBE}{secrets.token_hex(6)}_"  # no name an agent's schema could hold
        tables = [name for (name,) in self.connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'")]
        for number, table in enumerate(tables):
            name = f"{prefix}{number}"
            try:
                self.connection.execute(f"CREATE TRIGGER {name} AFTER DELETE ON {_quoted(table)} "
                                        "BEGIN SELECT 1; END")
            except sqlite3.Error:
                continue  # a virtual table, say: it has no rows to replace
            probes[name] = table
        self.connection.execute("PRAGMA recursive_triggers = ON")
        # Foreign keys' actions (ON DELETE CASCADE…) compiled too, whether or not the server's connection
        # turns them on (a change of that pragma is held): the authorizer hears the rows they would change.
        self.connection.execute("PRAGMA foreign_keys = ON")
        return probes

    def replaced(self, actions: list[tuple]) -> tuple[str, ...]:
        """The tables whose rows the last statement compiled may replace on a conflict: a probe heard without
        a delete of its table."""
        deleted = {first for action, first, *_ in actions if action == A.SQLITE_DELETE}
        return tuple(dict.fromkeys(self.probes[t] for *_, t in actions
                                   if t in self.probes and self.probes[t] not in deleted))

    def _heard(self, action, first, second, database, trigger):
        if self.applying:  # the copy takes schema changes, and never a file: no ATTACH, no VACUUM INTO
            return sqlite3.SQLITE_DENY if action in (A.SQLITE_ATTACH, A.SQLITE_DETACH) else sqlite3.SQLITE_OK
        self.actions.append((action, first, second, database, trigger))
        return sqlite3.SQLITE_OK

    def compile(self, piece: str, explained: bool) -> list[tuple]:
        self.actions = []
        self.connection.execute(piece if explained else f"EXPLAIN {piece}").fetchall()
        return self.actions

    def apply(self, piece: str) -> None:
        """The text's own schema change, made on the copy only (never anything that reaches a file)."""
        if _first_word(piece) not in ("CREATE", "DROP", "ALTER"):
            return
        self.applying = True
        try:
            self.connection.execute(piece)
        except sqlite3.Error:
            pass
        finally:
            self.applying = False

    def close(self):
        self.connection.close()


def _capture(actions: list[tuple], *, own: bool = False) -> list[str]:
    """The capture's own tables and triggers a statement would touch (its triggers' inserts are the capture
    working, not a touch; `own`: the actions are a trigger's the agent made, whatever its name)."""
    touched = []
    dropped = {first for action, first, *_ in actions if action == A.SQLITE_DROP_TABLE}
    for action, first, second, _, trigger in actions:
        if trigger and trigger.startswith(SQLITE_PREFIX) and not own:
            continue
        if action == A.SQLITE_DROP_TRIGGER and second in dropped or action == A.SQLITE_ANALYZE:
            # A dropped table's triggers go with it (the drop is what a person decides), and statistics of
            # every table, the capture's among them, are no touch.
            continue
        if action == A.SQLITE_PRAGMA and (first or "").lower() in CAPTURE_PRAGMAS and second is not None:
            touched.append(f"PRAGMA {first}")
        for name in (first, second) if action != A.SQLITE_FUNCTION else ():
            if isinstance(name, str) and name.startswith(SQLITE_PREFIX):
                touched.append(name)
    return list(dict.fromkeys(touched))


def _control(piece: str, mine: list[tuple]) -> Statement | None:
    """Transaction control: BEGIN, COMMIT, ROLLBACK, savepoints."""
    for action, first, *_ in mine:
        if action == A.SQLITE_TRANSACTION:
            return Statement("read", TRANSACTION_WORDS.get(first, "controls the transaction"), piece)
        if action == A.SQLITE_SAVEPOINT:
            verb = {"BEGIN": "sets a savepoint", "RELEASE": "releases a savepoint"}.get(
                first, "rolls back to a savepoint")
            return Statement("read", verb, piece)
    return None


def _schema_or_pragma(piece: str, mine: list[tuple]) -> Statement | None:
    """A change of the schema (or an attached file), or a pragma: read, or set."""
    schema = [(SCHEMA_ACTIONS[a], f) for a, f, *_ in mine if a in SCHEMA_ACTIONS]
    if schema:
        verb, name = schema[0]
        dropped = tuple(f for a, f, *_ in mine if a == A.SQLITE_DROP_TABLE)
        return Statement("destroy", f"{verb} {name}", piece, destroys=dropped,
                         reason=f"it {verb} {name}: not a change of rows a capture can put back")
    pragmas = [(f, s) for a, f, s, *_ in mine if a == A.SQLITE_PRAGMA]
    if not pragmas:
        return None
    name, value = pragmas[0]
    takes_a_name = name.lower().endswith(("_info", "_list", "_check", "xinfo"))
    if name.lower() in READ_PRAGMAS and (value is None or takes_a_name):
        return Statement("read", f"reads pragma {name}", piece)
    return Statement("destroy", f"sets pragma {name}", piece,
                     reason=f"it sets pragma {name}, which nothing records")


def _written(actions: list[tuple]) -> tuple[list[tuple], tuple[str, ...], tuple[str, ...]]:
    """The row writes (action, table, trigger), the tables the statement writes, and those only its
    triggers do; SQLite's own tables and the capture's are not the statement's."""
    writes = [(a, f, t) for a, f, _, _, t in actions
              if a in ROW_ACTIONS and not (f or "").startswith(("sqlite_", SQLITE_PREFIX))]
    own = tuple(dict.fromkeys(f for a, f, t in writes if not t))
    return writes, own, tuple(dict.fromkeys(f for a, f, t in writes if t and f not in own))


def _rows(piece: str, actions: list[tuple], word: str, replaced: tuple[str, ...] = ()) -> Statement | None:
    """A change of rows: by the statement itself, or by the triggers it fires. `replaced`: the tables whose
    rows it may replace on a conflict, as SQLite compiled it (`Copy.replaced`)."""
    writes, own, by_triggers = _written(actions)
    if not own and not by_triggers:
        return None
    verbs = "; ".join(dict.fromkeys(f"{ROW_ACTIONS[a]} {f}" for a, f, t in writes if not t))
    if replaced:
        return Statement("destroy", f"{verbs or 'changes rows through triggers'}, replacing rows of "
                         f"{named(replaced)} on a conflict", piece, writes=own, replaces=True, reason=(
                             f"it may replace rows of {named(replaced)} on a conflict (OR REPLACE, or the "
                             "table's own ON CONFLICT REPLACE): SQLite deletes them without telling the "
                             "triggers, so no capture sees them go"))
    # A DELETE whose condition reads nothing of its table's rows (none, `WHERE 1`, `WHERE true`, a WHERE in a
    # comment) takes every row of it, or none: SQLite's authorizer hears each column the condition reads.
    deleted = [f for a, f, t in writes if a == A.SQLITE_DELETE and not t][:1]
    read_here = {f for a, f, _, _, t in actions if a == A.SQLITE_READ and not t}
    whole = word in ("DELETE", "WITH") and bool(deleted) and deleted[0] not in read_here
    if whole and word == "DELETE" and len(own) == 1:
        verbs = f"deletes every row of {own[0]}"
    return Statement("rows", verbs or "changes rows through triggers", piece, writes=own,
                     triggers=by_triggers, whole_table=whole, destroys=tuple(deleted) if whole else ())


def _other(piece: str, actions: list[tuple], word: str) -> Statement:
    """What is left: a read, or a statement SQLite says nothing about (taken as the worst)."""
    if word in WORDS_AFTER:
        return Statement("destroy", WORDS_AFTER[word], piece, reason=f"it {WORDS_AFTER[word]}")

    def reads(action, table) -> bool:
        return action in READ_ACTIONS or action == A.SQLITE_FUNCTION or (
            action in ROW_ACTIONS and (table or "").startswith("sqlite_") and word != "WITH")

    if word in ("SELECT", "VALUES", "WITH") and all(reads(a, f) for a, f, *_ in actions):
        return Statement("read", "reads", piece)
    return Statement("destroy", f"runs {word or 'a statement'}", piece,
                     reason="SQLite does not say what it does, so it is taken as the worst")


def _triggers_touch(copy: Copy, actions: list[tuple]) -> list[str]:
    """What of the capture the triggers a statement creates would touch when they fire: each is fired on the
    copy (compiled, never run) by a write of its table, and what its body does is heard."""
    touched = []
    for action, name, table, *_ in actions:
        if action not in (A.SQLITE_CREATE_TRIGGER, A.SQLITE_CREATE_TEMP_TRIGGER):
            continue
        quoted = _quoted(table or "")
        for write in (f"INSERT INTO {quoted} DEFAULT VALUES", f"UPDATE {quoted} SET rowid = rowid",
                      f"DELETE FROM {quoted}"):
            try:
                heard = copy.compile(write, False)
            except sqlite3.Error:
                continue  # a write the table does not take (a view without its INSTEAD OF, say)
            touched += _capture([a for a in heard if a[4] == name], own=True)
    return list(dict.fromkeys(touched))


def _classify(piece: str, actions: list[tuple], explained: bool, replaced: tuple[str, ...] = ()) -> Statement:
    if explained:
        return Statement("read", "explains a query", piece)
    if touched := _capture(actions):
        return Statement("refused", "touches the capture", piece,
                         reason=f"it touches {named(touched)}, part of the capture that keeps the rows "
                                "agents change")
    mine = [a for a in actions if not a[4]]  # the statement's own, not its triggers'
    if (found := _control(piece, mine) or _schema_or_pragma(piece, mine)) is not None:
        return found
    word = _first_word(piece)
    functions = tuple(dict.fromkeys(s for a, _, s, *_ in actions if a == A.SQLITE_FUNCTION
                                    and (s or "").lower() in SIDE_EFFECT_FUNCTIONS))
    if functions:
        called = named([f + "()" for f in functions])
        return Statement("destroy", f"calls {called}", piece, functions=functions,
                         reason=f"it calls {called}, which can change anything, the capture included")
    # SQLite registers a pragma's table-valued function by writing its schema table: no write of the query's.
    if word not in ("SELECT", "VALUES") and any(f.startswith("sqlite_") for a, f, *_ in actions
                                                if a in ROW_ACTIONS and f):
        return Statement("destroy", "writes the schema table", piece,
                         reason="it writes SQLite's own schema table")
    return _rows(piece, actions, word, replaced) or _other(piece, actions, word)


def read(text: str, *, schema: Sequence[str] = (), copy: Copy | None = None) -> Reading:
    """Every statement of `text`, in order, compiled against a copy of `schema` (the database's own
    `sqlite_master.sql`, in order), or against `copy`, one made before from it."""
    pieces = statements(text)
    if not pieces:
        return Reading("sqlite", problem="there is no statement in it")
    own, read_ = copy is None, []
    copy = copy or Copy(schema)
    copy.connection.execute("SAVEPOINT reading")
    try:
        for piece in pieces:
            explained = _first_word(piece) == "EXPLAIN"
            try:
                actions = copy.compile(piece, explained)
            except sqlite3.Error as exc:
                return Reading("sqlite", problem=f"SQLite cannot compile {piece.strip()[:80]!r}: {exc}")
            statement = _classify(piece.strip(), actions, explained, copy.replaced(actions))
            read_.append(statement)
            if statement.kind == "destroy" and any(a in SCHEMA_ACTIONS for a, *_ in actions):
                copy.apply(piece)
                if touched := _triggers_touch(copy, actions):
                    read_[-1] = Statement("refused", "touches the capture", piece.strip(), reason=(
                        f"it creates a trigger that touches {named(touched)}, part of the capture that keeps "
                        "the rows agents change"))
    finally:
        copy.connection.execute("ROLLBACK TO reading")
        copy.connection.execute("RELEASE reading")
        if own:
            copy.close()
    return Reading("sqlite", tuple(transaction_control_among_others(read_)))
