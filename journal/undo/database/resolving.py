"""What of a PostgreSQL text PostgreSQL itself can be asked to resolve (`journal.upstream.catalogue`
makes a temporary view of each, never run): every plain SELECT as it is, and for each row change a SELECT
of the expressions it evaluates (its SET values, VALUES rows, WHERE, FROM or USING, ON CONFLICT's update
and RETURNING), so a function it calls by column notation (`contacts.shout`), an operator or a cast to a
domain is seen in a write as it is in a read. Printed by pglast from the parsed statement, so nothing but
the statement's own expressions can ride along."""

from pglast import ast, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from .postgres import writes_of

ROW_CHANGES = (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)


def selects(text: str) -> list[tuple[int, str, bool]]:
    """`(statement's index, SELECT, derived)` for each plain SELECT of `text` (no INTO, no data-modifying
    WITH; and each that an EXPLAIN ANALYZE runs), and each SELECT derived from a row change (`derived`: a
    view PostgreSQL will not make of it, one naming `DEFAULT` say, tells nothing either way)."""
    try:
        raw = parse_sql(text)
    except (ParseError, RecursionError, MemoryError, ValueError):
        return []
    found = []
    for index, stmt in enumerate(r.stmt for r in raw):
        if isinstance(stmt, ast.ExplainStmt):
            stmt = stmt.query
        try:
            if isinstance(stmt, ast.SelectStmt) and stmt.intoClause is None and not writes_of(stmt):
                found.append((index, printed(stmt), False))
            elif isinstance(stmt, ROW_CHANGES):
                found += [(index, select, True) for select in _derived(stmt)]
        except Exception:  # noqa: BLE001 - a statement pglast cannot print: not resolved, taken by its names
            continue
    return found


def _derived(stmt) -> list[str]:
    """SELECTs of what a row change evaluates (its WITH, when it writes nothing, kept in front; a row
    change inside its WITH is derived on its own)."""
    with_ = ""
    found = []
    if stmt.withClause is not None:
        inner = [cte.ctequery for cte in stmt.withClause.ctes or ()]
        if any(writes_of(query) for query in inner):
            found += [s for query in inner if isinstance(query, ROW_CHANGES) for s in _derived(query)]
        else:
            with_ = f"WITH {printed(stmt.withClause)} "
    relation = printed(stmt.relation)
    expressions, laterals = _evaluated(getattr(stmt, "targetList", None))
    returning = stmt.returningClause.exprs if stmt.returningClause is not None else ()
    expressions += [printed(t.val) for t in returning or ()]
    froms = [relation, *(printed(f) for f in (getattr(stmt, "fromClause", None)
                                               or getattr(stmt, "usingClause", None) or ())), *laterals]
    where = f" WHERE {printed(stmt.whereClause)}" if getattr(stmt, "whereClause", None) is not None else ""
    if isinstance(stmt, ast.InsertStmt):
        found += _inserted(stmt, with_, relation)
    found.append(f"{with_}SELECT {', '.join(expressions) or '1'} FROM {', '.join(froms)}{where}")
    return found


def _inserted(stmt: ast.InsertStmt, with_: str, relation: str) -> list[str]:
    """What an INSERT evaluates besides its RETURNING: its rows (each VALUES row's expressions, or its
    query) and its ON CONFLICT update, which reads the proposed row as `excluded`."""
    found = []
    source = stmt.selectStmt
    if isinstance(source, ast.SelectStmt) and source.valuesLists:
        row = [printed(e) for values in source.valuesLists for e in values
               if not isinstance(e, ast.SetToDefault)]
        if row:
            found.append(f"{with_}SELECT {', '.join(row)}")
    elif source is not None:
        found.append(f"{with_}{printed(source)}")
    conflict = stmt.onConflictClause
    if conflict is not None and conflict.targetList:
        expressions, laterals = _evaluated(conflict.targetList)
        where = f" WHERE {printed(conflict.whereClause)}" if conflict.whereClause is not None else ""
        table = printed(ast.RangeVar(schemaname=stmt.relation.schemaname, relname=stmt.relation.relname,
                                     inh=True, relpersistence="p"))
        froms = ", ".join([relation, f"{table} AS excluded", *laterals])
        found.append(f"{with_}SELECT {', '.join(expressions) or '1'} FROM {froms}{where}")
    return found


def _evaluated(targets) -> tuple[list[str], list[str]]:
    """The values a SET list evaluates, printed: each one's expression, and each `(a, b) = (SELECT …)`'s
    query once, as a LATERAL item of the FROM list (its columns are many, and it may read the row)."""
    values = [target.val for target in targets or ()]
    sources = {printed(v.source): v.source for v in values if isinstance(v, ast.MultiAssignRef)}
    expressions = [printed(v) for v in values if not isinstance(v, (ast.MultiAssignRef, ast.SetToDefault))]
    expressions += [text for text, source in sources.items() if not isinstance(source, ast.SubLink)]
    laterals = [f"LATERAL ({printed(source.subselect)}) AS undo_set{n}"
                for n, source in enumerate(s for s in sources.values() if isinstance(s, ast.SubLink))]
    return expressions, laterals


def printed(node) -> str:
    """A node as SQL, by pglast (a printer each time: one keeps what it printed)."""
    return RawStream()(node)
