"""What an SQL text would do, statement by statement, in words a person reads, and which statement decides
for the whole text. The dialects' readers (`postgres`, `sqlite`) fill these in. No ORM and no clock.

Every statement is one of four kinds, from harmless to worst:

- `read`: it changes nothing (a plain `SELECT`, `EXPLAIN` without `ANALYZE`, `SHOW`, a read-only pragma);
- `rows`: it changes rows of named tables (`INSERT`, `UPDATE`, `DELETE`, `MERGE`, an upsert, a data-modifying
  `WITH`), which the capture can take back when those tables are captured;
- `destroy`: anything else (DDL, `TRUNCATE`, `GRANT`, `COPY`, `DO`, `CALL`, a function with side effects, a
  change of role or settings, transaction control among other statements): it cannot be undone row by row;
- `refused`: it touches the capture itself, and is never sent.

A text takes its worst statement's kind; a text the grammar cannot read is `unknown`.
"""

from dataclasses import dataclass, field
from typing import Literal

# Where the capture lives: PostgreSQL's schema and trigger names, SQLite's table and trigger prefix.
CAPTURE_SCHEMA = "undo_capture"
CAPTURE_TRIGGER = "undo_capture"
SQLITE_PREFIX = "_undo_capture"
TEXT_LIMIT = 300  # a statement's text as the record shows it

StatementKind = Literal["read", "rows", "destroy", "refused"]
ReadingKind = Literal["read", "rows", "destroy", "refused", "unknown"]
ORDER = ("read", "rows", "destroy", "refused")


@dataclass(frozen=True)
class Statement:
    """One statement: its kind, its verb in words ("deletes rows of contacts"), and the tables it acts on."""

    kind: StatementKind
    verb: str
    text: str = ""
    writes: tuple[str, ...] = ()  # tables whose rows it inserts, updates or deletes
    destroys: tuple[str, ...] = ()  # tables it drops or empties (their rows are counted before it runs)
    whole_table: bool = False  # a DELETE with no WHERE: every row of its table
    functions: tuple[str, ...] = ()  # functions it calls whose effects the reader cannot know
    replaces: bool = False  # an INSERT OR REPLACE: rows it deletes on a conflict go unseen by triggers
    triggers: tuple[str, ...] = ()  # tables changed by the triggers of the tables it writes (SQLite knows)
    reason: str = ""  # for `destroy` and `refused`: why, in words

    def as_record(self) -> dict:
        data = {"kind": self.kind, "verb": self.verb, "text": self.text[:TEXT_LIMIT]}
        for name in ("writes", "destroys", "functions", "triggers"):
            if getattr(self, name):
                data[name] = list(getattr(self, name))
        if self.whole_table:
            data["wholeTable"] = True
        if self.reason:
            data["reason"] = self.reason
        return data


@dataclass(frozen=True)
class Reading:
    """What a whole text would do. `problem` says why the grammar could not read it (then `unknown`)."""

    dialect: str
    statements: tuple[Statement, ...] = ()
    problem: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def kind(self) -> ReadingKind:
        if self.problem or not self.statements:
            return "unknown"
        return max((s.kind for s in self.statements), key=ORDER.index)

    @property
    def worst(self) -> Statement | None:
        """The statement that decides for the text (the first of the worst kind)."""
        kind = self.kind
        worst = [s for s in self.statements if s.kind == kind]
        # Of equals, the one that destroys most plainly: a drop over the COMMIT that let it out.
        worst.sort(key=lambda s: (not s.destroys, s.verb in TRANSACTION_VERBS))
        return worst[0] if worst else None

    def writes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for s in self.statements for t in (*s.writes, *s.triggers)))

    def as_record(self) -> dict:
        data = {"dialect": self.dialect, "kind": self.kind,
                "statements": [s.as_record() for s in self.statements[:50]]}
        if len(self.statements) > 50:
            data["more"] = len(self.statements) - 50
        if self.problem:
            data["problem"] = self.problem
        return data


def plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


def named(tables: tuple[str, ...] | list[str]) -> str:
    names = list(dict.fromkeys(tables))
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def transaction_control_among_others(statements: list[Statement]) -> list[Statement]:
    """Transaction control alone changes nothing; among other statements it is the worst kind: it ends the
    transaction a server wraps around the text (its read-only one, say) and begins what follows outside it.
    A text that is one whole transaction (BEGIN first, COMMIT or ROLLBACK last, no other control) runs its
    statements inside whatever the server wrapped around it, and is read as those statements."""
    if len(statements) < 2:
        return statements
    control = [i for i, s in enumerate(statements) if s.verb in TRANSACTION_VERBS]
    if control == [0, len(statements) - 1] and statements[0].verb == "begins a transaction" and \
            statements[-1].verb in ("commits the transaction", "rolls the transaction back"):
        return statements  # the whole text as one transaction: inside any the server wraps, ending with it
    return [Statement("destroy", s.verb, s.text, reason=(
        f"it {s.verb} among other statements: whatever transaction the server wrapped around the text (a "
        "read-only one, say) no longer holds for what follows"))
        if s.verb in TRANSACTION_VERBS else s for s in statements]


TRANSACTION_VERBS = ("begins a transaction", "commits the transaction", "rolls the transaction back",
                     "sets a savepoint", "releases a savepoint", "rolls back to a savepoint",
                     "prepares the transaction for two-phase commit", "sets the transaction's mode")


def left_open(statements: tuple[Statement, ...], dialect: str) -> bool:
    """Whether the text ends inside a transaction it began: its rows would be committed by a later call, or
    never, outside every call's window. SQLite begins a transaction at a savepoint set outside one, and ends
    it when that savepoint is released; a prepared transaction (two-phase commit) stays open after the
    text."""
    open_, by_savepoint = False, 0
    for statement in statements:
        verb = statement.verb
        if verb == "begins a transaction":
            open_ = True
        elif verb in ("commits the transaction", "rolls the transaction back"):
            open_, by_savepoint = False, 0
        elif verb == "prepares the transaction for two-phase commit":
            return True
        elif verb == "sets a savepoint" and dialect == "sqlite" and (by_savepoint or not open_):
            open_, by_savepoint = True, by_savepoint + 1
        elif verb == "releases a savepoint" and by_savepoint:
            by_savepoint -= 1
            open_ = by_savepoint > 0
    return open_


def as_run(reading: Reading, *, keeps_connection: bool, split_problem: str | None = None) -> Reading:
    """The reading of a text as its server will run it: refused when the server cuts it otherwise than the
    database reads it (`split_problem`), when it leaves a transaction open, or when it is nothing but
    transaction control sent to a server that keeps its connection between calls (its effect would reach
    the next call's statements, outside this call's window)."""
    if split_problem:  # whether or not the grammar could read the text: what runs would be something else
        return Reading(reading.dialect, (Statement("refused", "is cut otherwise by its server",
                                                   reason=split_problem),), notes=reading.notes)
    if reading.problem or not reading.statements:
        return reading
    if keeps_connection and reading.dialect == "sqlite" and any(s.verb in TRANSACTION_VERBS
                                                                for s in reading.statements):
        return Reading(reading.dialect, (Statement(
            "refused", "controls a transaction on a kept connection", reason=(
                "it controls a transaction, and this server runs each statement of a text on its own over a "
                "connection it keeps, leaving a transaction open when a statement fails, so later calls' "
                "rows would be committed outside their windows; send the statements without BEGIN and "
                "COMMIT")),), notes=reading.notes)
    if left_open(reading.statements, reading.dialect):
        return Reading(reading.dialect, (Statement(
            "refused", "leaves a transaction open", reason=(
                "it leaves a transaction open, so its rows would be committed by a later call, outside the "
                "window that keeps this call's rows; send the whole transaction, from its BEGIN to its "
                "COMMIT, in one call")),), notes=reading.notes)
    if keeps_connection and all(s.verb in TRANSACTION_VERBS for s in reading.statements):
        return Reading(reading.dialect, (Statement(
            "refused", "controls a transaction on its own", reason=(
                "it is transaction control on its own, and this server keeps its connection between calls, "
                "so it would reach the statements of other calls; send the whole transaction, from its BEGIN "
                "to its COMMIT, in one call")),), notes=reading.notes)
    return reading
