"""What of a PostgreSQL text PostgreSQL itself can be asked to resolve (`journal.upstream.catalogue`
makes a temporary view of each, never run): every plain SELECT as it is, and for each row change (INSERT,
UPDATE, DELETE, MERGE, and a SELECT whose WITH writes) SELECTs of the expressions it evaluates (its SET
values and their subscripts, VALUES rows, WHERE, FROM or USING, ON CONFLICT's update, MERGE's conditions and
actions, RETURNING), so a function it calls by column notation (`contacts.shout`), an operator or a cast to
a domain is seen in a write as it is in a read. Printed by pglast from the parsed statement, so nothing but
the statement's own expressions can ride along. A statement that cannot be printed so is `UNRESOLVED`:
what it evaluates is then unknown, and it is judged as such (never passed by)."""

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from .postgres import writes_of

ROW_CHANGES = (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt)
UNRESOLVED = ""  # the SELECT of a statement that could not be printed: PostgreSQL cannot be asked
COLUMNS_A_SELECT = 1600  # PostgreSQL's limit is 1,664 columns: a long VALUES list goes in several SELECTs


def selects(text: str) -> list[tuple[int, str, bool]]:
    """`(statement's index, SELECT, derived)` for each plain SELECT of `text` (no INTO, no data-modifying
    WITH; and each that an EXPLAIN ANALYZE runs), and each SELECT derived from a row change; `UNRESOLVED`
    for a statement pglast cannot print (too deep, say)."""
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
            elif isinstance(stmt, (*ROW_CHANGES, ast.SelectStmt)):
                found += [(index, select, True) for select in _derived(stmt)]
        except Exception:  # noqa: BLE001 - a statement pglast cannot print: unknown, never passed by
            found.append((index, UNRESOLVED, True))
    return found


def _derived(stmt) -> list[str]:
    """SELECTs of what a row change evaluates. A row change inside its WITH is derived on its own, and in
    the WITH kept in front of the rest it stands as a SELECT of what it returns."""
    with_, found = "", []
    if stmt.withClause is not None:
        ctes = []
        for cte in stmt.withClause.ctes or ():
            query = cte.ctequery
            if isinstance(query, ROW_CHANGES):
                found += _derived(query)
                query = _standing_in(query)
            elif writes_of(query):
                found += _derived(query)
            columns = f" ({', '.join(c.sval for c in cte.aliascolnames)})" if cte.aliascolnames else ""
            body = query if isinstance(query, str) else printed(query)
            ctes.append(f"{_quoted(cte.ctename)}{columns} AS ({body})")
        with_ = f"WITH {'RECURSIVE ' if stmt.withClause.recursive else ''}{', '.join(ctes)} "
    if isinstance(stmt, ast.SelectStmt):  # its WITH writes: the query itself, over the stand-ins
        return [*found, with_ + printed(_without_with(stmt))]
    if isinstance(stmt, ast.MergeStmt):
        return [*found, *_merged(stmt, with_)]
    relation = printed(stmt.relation)
    expressions, laterals = _evaluated(getattr(stmt, "targetList", None))
    expressions += _returned(stmt)
    froms = [relation, *(printed(f) for f in (getattr(stmt, "fromClause", None)
                                               or getattr(stmt, "usingClause", None) or ())), *laterals]
    where = f" WHERE {printed(stmt.whereClause)}" if getattr(stmt, "whereClause", None) is not None else ""
    if isinstance(stmt, ast.InsertStmt):
        found += _inserted(stmt, with_, relation)
    found.append(f"{with_}SELECT {', '.join(expressions) or '1'} FROM {', '.join(froms)}{where}")
    return found


def _standing_in(stmt) -> str:
    """A SELECT that returns what a row change in a WITH returns (its RETURNING, over its table), for the
    statements that read that WITH to be resolved as they would run."""
    returned = _returned(stmt) or ["1"]
    froms = [printed(stmt.relation), *(printed(f) for f in getattr(stmt, "fromClause", None) or ())]
    return f"SELECT {', '.join(returned)} FROM {', '.join(froms)}"


def _returned(stmt) -> list[str]:
    clause = getattr(stmt, "returningClause", None)
    return [printed(t.val) for t in (clause.exprs if clause is not None else ()) or ()]


def _without_with(stmt: ast.SelectStmt) -> ast.SelectStmt:
    stmt.withClause = None
    return stmt


def _inserted(stmt: ast.InsertStmt, with_: str, relation: str) -> list[str]:
    """What an INSERT evaluates besides its RETURNING: its rows (each VALUES row's expressions, or its
    query) and its ON CONFLICT update, which reads the proposed row as `excluded`."""
    found = []
    source = stmt.selectStmt
    if isinstance(source, ast.SelectStmt) and source.valuesLists:
        found += _values(source.valuesLists, with_)
    elif source is not None:
        found.append(f"{with_}{printed(source)}")
    found += _subscripts(stmt.cols, with_, relation)
    conflict = stmt.onConflictClause
    if conflict is not None and conflict.targetList:
        expressions, laterals = _evaluated(conflict.targetList)
        where = f" WHERE {printed(conflict.whereClause)}" if conflict.whereClause is not None else ""
        table = printed(ast.RangeVar(schemaname=stmt.relation.schemaname, relname=stmt.relation.relname,
                                     inh=True, relpersistence="p"))
        froms = ", ".join([relation, f"{table} AS excluded", *laterals])
        found.append(f"{with_}SELECT {', '.join(expressions) or '1'} FROM {froms}{where}")
    return found


def _values(rows, with_: str) -> list[str]:
    """A VALUES list's expressions (DEFAULT aside), as few SELECTs as PostgreSQL's column limit allows."""
    expressions = [printed(e) for values in rows for e in values if not isinstance(e, ast.SetToDefault)]
    return [f"{with_}SELECT {', '.join(expressions[start:start + COLUMNS_A_SELECT])}"
            for start in range(0, len(expressions), COLUMNS_A_SELECT)]


def _merged(stmt: ast.MergeStmt, with_: str) -> list[str]:
    """What a MERGE evaluates: its join, and each action's condition, SET values and VALUES, over its
    target and its source."""
    expressions, laterals = [], []
    for action in stmt.mergeWhenClauses or ():
        if action.condition is not None:
            expressions.append(printed(action.condition))
        if action.commandType == enums.CmdType.CMD_INSERT:  # its VALUES, over the source
            expressions += [printed(v) for v in action.values or () if not isinstance(v, ast.SetToDefault)]
        else:
            values, more = _evaluated(action.targetList)
            expressions += values
            laterals += more
    expressions += _returned(stmt)
    froms = ", ".join([printed(stmt.relation), printed(stmt.sourceRelation), *laterals])
    return [f"{with_}SELECT {', '.join(expressions) or '1'} FROM {froms} WHERE {printed(stmt.joinCondition)}"]


def _evaluated(targets) -> tuple[list[str], list[str]]:
    """The values a SET list evaluates, printed: each one's expression and subscripts (`tags[c.n] = …`),
    and each `(a, b) = (SELECT …)`'s query once, as a LATERAL item of the FROM list, its columns named
    apart from the table's (its columns are many, and it may read the row)."""
    values = [target.val for target in targets or ()]
    sources = {printed(v.source): v for v in values if isinstance(v, ast.MultiAssignRef)}
    expressions = [printed(v) for v in values if not isinstance(v, (ast.MultiAssignRef, ast.SetToDefault))]
    expressions += [text for text, v in sources.items() if not isinstance(v.source, ast.SubLink)]
    expressions += _indexes(targets)
    laterals = [f"LATERAL ({printed(v.source.subselect)}) AS undo_capture_set_{n} "
                f"({', '.join(f'undo_capture_set_{n}_{c}' for c in range(v.ncolumns))})"
                for n, v in enumerate(v for v in sources.values() if isinstance(v.source, ast.SubLink))]
    return expressions, laterals


def _subscripts(columns, with_: str, relation: str) -> list[str]:
    """An INSERT's subscripted columns (`tags[c.n]`): their subscripts, over its table."""
    indexes = _indexes(columns)
    return [f"{with_}SELECT {', '.join(indexes)} FROM {relation}"] if indexes else []


def _indexes(targets) -> list[str]:
    """The subscripts of the columns a SET list or an INSERT's column list names (`tags[c.n]`), printed."""
    return [printed(index) for target in targets or () for part in target.indirection or ()
            if isinstance(part, ast.A_Indices) for index in (part.lidx, part.uidx) if index is not None]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def printed(node) -> str:
    """A node as SQL, by pglast (a printer each time: one keeps what it printed)."""
    return RawStream()(node)
