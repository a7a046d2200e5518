"""What writing a PostgreSQL table reaches beyond it, from the catalogue: the foreign keys whose actions
change other tables (`ON DELETE CASCADE`, `SET NULL`, `SET DEFAULT`, and their `ON UPDATE` kin), the user
triggers whose functions write other tables (read from the functions' own text: PL/pgSQL through
libpg_query's PL/pgSQL parser, SQL through the SQL grammar), and rules, followed from table to table. What
cannot be followed (a trigger in C, SQL built as it runs, a function it calls) is said, and makes the call
one a person decides. SQLite needs none of this: compiling a statement there hears its triggers and foreign
keys' actions too (`journal.undo.database.sqlite`). Synchronous, on the Recorder's own connection."""

from collections.abc import Callable, Iterator, Sequence

from pglast import parse_plpgsql
from pglast.parser import ParseError

from ..undo.database import postgres
from ..undo.database.reading import CAPTURE_TRIGGER

FOLLOWED = 50  # tables followed from a statement's own, at most; past it the rest is not cleared
ACTIONS = {"c": ("{verb}", "CASCADE"), "n": ("sets to null a column of", "SET NULL"),
           "d": ("sets to its default a column of", "SET DEFAULT")}

PG_FOREIGN_KEYS = """
SELECT n.nspname || '.' || r.relname, k.confdeltype, k.confupdtype
FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid JOIN pg_namespace n ON n.oid = r.relnamespace
WHERE k.contype = 'f' AND k.confrelid = to_regclass(%s)
"""
PG_TRIGGERS = """
SELECT t.tgname, l.lanname, CASE WHEN l.lanname IN ('plpgsql', 'sql') THEN pg_get_functiondef(p.oid) END,
       p.prosrc, t.tgtype::int
FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_language l ON l.oid = p.prolang
WHERE t.tgrelid = to_regclass(%s) AND NOT t.tgisinternal AND t.tgname <> %s
"""
# Tables that inherit from it: an UPDATE or DELETE of the parent changes their rows too, and a parent's row
# triggers (the capture's) do not fire for them. A partitioned table's are its partitions, whose row
# triggers are its own, cloned: not followed.
PG_CHILDREN = """
SELECT n.nspname || '.' || c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_class p ON p.oid = i.inhparent
WHERE i.inhparent = to_regclass(%s) AND p.relkind <> 'p'
"""
PG_RULES = "SELECT rulename FROM pg_rewrite WHERE ev_class = to_regclass(%s) AND rulename <> '_RETURN'"
# What a table's column defaults, CHECK constraints, triggers' WHEN conditions and row security policies
# use outside the built-ins and the extensions (the built-ins are pinned, so no dependency on them is
# recorded): functions and operators; and the domains of its columns whose checks may call anything.
PG_EXPRESSIONS = """
WITH mine AS (
    SELECT 'pg_attrdef'::regclass AS classid, oid, 'a column default' AS kind FROM pg_attrdef
    WHERE adrelid = to_regclass(%(table)s)
    UNION ALL SELECT 'pg_constraint'::regclass, oid, 'a check' FROM pg_constraint
    WHERE conrelid = to_regclass(%(table)s)
    UNION ALL SELECT 'pg_trigger'::regclass, oid, 'the condition of trigger ' || tgname FROM pg_trigger
    WHERE tgrelid = to_regclass(%(table)s) AND NOT tgisinternal
    UNION ALL SELECT 'pg_policy'::regclass, oid, 'row security policy ' || polname FROM pg_policy
    WHERE polrelid = to_regclass(%(table)s))
SELECT DISTINCT mine.kind, CASE WHEN d.refclassid = 'pg_proc'::regclass
                                THEN (SELECT n.nspname || '.' || p.proname || '()' FROM pg_proc p
                                      JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = d.refobjid)
                                ELSE (SELECT 'operator ' || o.oprname FROM pg_operator o
                                      WHERE o.oid = d.refobjid)
                           END
FROM mine JOIN pg_depend d ON d.classid = mine.classid AND d.objid = mine.oid
WHERE d.refclassid IN ('pg_proc'::regclass, 'pg_operator'::regclass)
  AND NOT (mine.classid = 'pg_trigger'::regclass
           AND d.refobjid = (SELECT tgfoid FROM pg_trigger WHERE oid = mine.oid))
  AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.classid = d.refclassid AND e.objid = d.refobjid
                  AND e.deptype = 'e')
UNION ALL
SELECT 'a column of domain ' || t.typname, 'its checks'
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass(%(table)s) AND a.attnum > 0 AND NOT a.attisdropped AND t.typtype = 'd'
  AND EXISTS (SELECT 1 FROM pg_constraint c WHERE c.contypid = t.oid)
"""
PG_QUALIFIED = """
SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(%s)
"""


EVERY = frozenset({"INSERT", "UPDATE", "DELETE"})
TRIGGER_EVENTS = {"INSERT": 4, "DELETE": 8, "UPDATE": 16}  # pg_trigger.tgtype's bits


def reaches(connection, tables: Sequence[str], *, events: frozenset[str] = EVERY,
            unsafe: Callable[[list[str]], list[str]] = lambda functions: postgres.unsafe_of(functions),
            listed: Sequence[str] = ()) -> dict[str, tuple]:
    """For each of `tables` (as the SQL names them), what writing it reaches: (table, verb, how) for a
    table reached, ("", "", why) for what cannot be followed (`judging.Catalog.reaches`). `events`: what the
    statement does to its tables (INSERT, UPDATE, DELETE): only the triggers and foreign keys' actions
    those fire are followed. `unsafe`: of the functions a trigger calls, those that may change data (the
    catalogue's word, `catalogue.safe_functions`); `listed`: the functions an admin vouches for."""
    found = {}
    follow = _Follow(connection, unsafe, {name.lower() for name in listed})
    for table in dict.fromkeys(tables):
        found[table] = tuple(follow.all(table, events))
    return {table: reached for table, reached in found.items() if reached}


class _Follow:
    """One statement's following, with the catalogue's judgment of the functions met on the way."""

    def __init__(self, connection, unsafe, listed: set[str]):
        self.connection, self.unsafe, self.listed = connection, unsafe, listed

    def all(self, table: str, events: frozenset[str]) -> Iterator[tuple[str, str, str]]:
        """Everything reached from `table`, breadth first, each table once for each set of events."""
        start = _qualified(self.connection, table)
        if start is None:
            return
        seen, pending = {(start, events)}, [(start, events)]
        while pending:
            current, fired = pending.pop(0)
            for reached, verb, how, then in self.step(current, fired):
                yield reached, verb, how
                if reached and (reached, then) not in seen:
                    if len(seen) >= FOLLOWED:
                        yield "", "", f"it reaches more than {FOLLOWED} tables"
                        return
                    seen.add((reached, then))
                    pending.append((reached, then))

    def step(self, table: str, events: frozenset[str]) -> Iterator[tuple[str, str, str, frozenset]]:
        """What one table's writes reach directly, each with the events it fires there."""
        rows = self.connection.rows
        yield from self.related(table, events)
        for (rule,) in rows(PG_RULES, (table,)):
            yield "", "", f"{table} has rule {rule}, which may do anything instead", EVERY
        writes_values = bool(events & {"INSERT", "UPDATE"})
        for kind, used in rows(PG_EXPRESSIONS, {"table": table}):
            if kind.startswith(("a column", "a check")) and not writes_values:
                continue  # defaults, checks and columns' domains are for the values a row is given
            bare = used.removesuffix("()")
            if bare.lower() not in self.listed and bare.split(".")[-1].lower() not in self.listed:
                yield "", "", f"{kind} of {table} uses {used}, which may change data", EVERY
        for name, language, definition, source, kinds in rows(PG_TRIGGERS, (table, CAPTURE_TRIGGER)):
            if any(kinds & TRIGGER_EVENTS[event] for event in events):
                for reached, verb, how in _trigger(name, language, definition, source, table, self.unsafe):
                    qualified = (_qualified(self.connection, reached) or reached) if reached else ""
                    yield qualified, verb, how, EVERY


    def related(self, table: str, events: frozenset[str]) -> Iterator[tuple[str, str, str, frozenset]]:
        """The tables whose foreign keys' actions the events fire, and those that inherit from `table`."""
        rows = self.connection.rows
        for referencing, on_delete, on_update in rows(PG_FOREIGN_KEYS, (table,)):
            for code, event in ((on_delete, "DELETE"), (on_update, "UPDATE")):
                if code in ACTIONS and event in events:
                    verb, action = ACTIONS[code]
                    deletes = code == "c" and event == "DELETE"
                    yield (referencing, verb.format(verb="deletes rows of" if deletes else "updates rows of"),
                           f"ON {event} {action}", frozenset({"DELETE" if deletes else "UPDATE"}))
        inherited = events & {"UPDATE", "DELETE"}
        for (child,) in rows(PG_CHILDREN, (table,)) if inherited else ():
            yield child, "also changes rows of", f"it inherits from {table}", inherited


def _qualified(connection, table: str) -> str | None:
    found = connection.rows(PG_QUALIFIED, (table,))
    return found[0][0] if found else None


def _trigger(name: str, language: str, definition: str | None, source: str, table: str, unsafe_of):
    """The tables a user trigger's function writes, from its own text."""
    if language == "sql":
        queries = [source]
    elif language == "plpgsql":
        try:
            queries = list(_plpgsql_queries(parse_plpgsql(definition or "")))
        except (ParseError, RecursionError, ValueError) as exc:
            yield "", "", f"trigger {name} on {table} cannot be read ({type(exc).__name__})"
            return
        if None in queries:
            yield "", "", f"trigger {name} on {table} runs SQL it builds as it goes (EXECUTE)"
            return
    else:
        yield "", "", f"trigger {name} on {table} is written in {language}, which the Recorder cannot read"
        return
    for query in queries:
        functions, _ = postgres.names_in(query)
        writes = postgres.writes_in(query)
        if writes is None:
            yield "", "", f"trigger {name} on {table} runs a statement the Recorder cannot read"
            return
        for written in writes:
            yield written, "writes", f"its trigger {name}"
        unsafe = unsafe_of(functions)
        if unsafe:
            called = ", ".join(postgres.shown(f) for f in unsafe)
            yield "", "", f"trigger {name} on {table} calls {called}, which the Recorder does not follow"


def _plpgsql_queries(tree) -> Iterator[str | None]:
    """Every SQL statement and expression in a PL/pgSQL function's tree; None for SQL built as it runs."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key in ("PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors"):
                yield None
            elif key == "PLpgSQL_expr" and isinstance(value, dict):
                query = value.get("query") or ""
                # Expressions and assignments (`NEW.at := now()`) are read as the SELECT PL/pgSQL makes.
                yield query if value.get("parseMode", 0) == 0 else "SELECT " + query.split(":=", 1)[-1]
            else:
                yield from _plpgsql_queries(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _plpgsql_queries(item)

