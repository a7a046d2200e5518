"""PostgreSQL's SQL read by PostgreSQL's own grammar (pglast, over libpg_query): each statement's kind, its
verb and the tables it acts on (`reading`). No ORM and no clock: what the catalogue knows (which functions
are free of side effects) comes in as `safe`."""

import re
from collections.abc import Collection, Mapping

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError, scan
from pglast.visitors import Visitor

from .reading import (
    CAPTURE_SCHEMA,
    CAPTURE_TRIGGER,
    Reading,
    Statement,
    named,
    transaction_control_among_others,
)

# Built-in functions an agent's reads use that change nothing (immutable or stable in pg_proc, or volatile
# only in what they return). Any other function is asked of the catalogue (`safe`) or taken to change data.
SAFE_FUNCTIONS = frozenset("""
abs avg bool_and bool_or ceil ceiling coalesce concat concat_ws count date_part date_trunc every exp extract
floor greatest initcap least left length lower lpad ltrim max md5 min mod now nullif octet_length position
power random regexp_match regexp_matches regexp_replace regexp_split_to_array regexp_split_to_table repeat
replace reverse right round rpad rtrim sign split_part sqrt stddev stddev_pop stddev_samp strpos substr
substring sum to_char to_date to_number to_timestamp translate trim trunc upper variance var_pop var_samp
age clock_timestamp current_date current_time current_timestamp localtime localtimestamp statement_timestamp
transaction_timestamp timeofday make_date make_interval make_time make_timestamp make_timestamptz
date_bin isfinite justify_days justify_hours justify_interval
array_agg array_append array_cat array_length array_lower array_position array_positions array_prepend
array_remove array_replace array_to_string array_upper cardinality string_to_array unnest generate_series
generate_subscripts string_agg json_agg jsonb_agg json_object_agg jsonb_object_agg json_build_object
jsonb_build_object json_build_array jsonb_build_array to_json to_jsonb row_to_json json_array_length
jsonb_array_length json_each jsonb_each json_each_text jsonb_each_text json_extract_path jsonb_extract_path
json_extract_path_text jsonb_extract_path_text json_object_keys jsonb_object_keys json_typeof jsonb_typeof
jsonb_pretty jsonb_set jsonb_insert jsonb_strip_nulls jsonb_path_query jsonb_path_exists jsonb_path_match
json_array_elements jsonb_array_elements json_array_elements_text jsonb_array_elements_text
row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
percentile_cont percentile_disc mode corr covar_pop covar_samp regr_slope regr_intercept
format quote_ident quote_literal quote_nullable encode decode convert_from convert_to btrim chr ascii
char_length character_length bit_length starts_with to_hex gen_random_uuid uuid_generate_v4 sha224 sha256
sha384 sha512 digest ln log log10 pi radians degrees sin cos tan asin acos atan atan2 div cbrt factorial gcd
lcm width_bucket scale trim_scale num_nonnulls num_nulls setseed pg_sleep version current_database
current_schema current_schemas current_user session_user current_setting pg_typeof pg_column_size
pg_table_size pg_relation_size pg_total_relation_size pg_indexes_size pg_database_size pg_size_pretty
pg_get_viewdef pg_get_indexdef pg_get_constraintdef pg_get_functiondef pg_get_triggerdef pg_get_expr
pg_get_userbyid pg_table_is_visible has_table_privilege has_schema_privilege has_column_privilege
has_database_privilege has_function_privilege obj_description col_description format_type
pg_backend_pid inet_client_addr txid_current_if_assigned pg_current_xact_id_if_assigned array_dims
ts_rank to_tsvector to_tsquery plainto_tsquery websearch_to_tsquery phraseto_tsquery ts_headline
similarity levenshtein soundex difference
""".split())
# The built-in operators' names: one of them is a read unless a user's operator shares the name (asked of the
# catalogue when there is one).
SAFE_OPERATORS = frozenset("""
= <> != < > <= >= + - * / % ^ || ~~ !~~ ~~* !~~* ~ ~* !~ !~* @> <@ && -> ->> #> #>> ? ?| ?& @? @@ @@@ |/ ||/
@ & | # << >> <-> <#> <=> -|- &< &> |>> <<| #- !!
""".split())
TRIGGER_SWITCHES = {
    getattr(enums.AlterTableType, name) for name in (
        "AT_EnableTrig", "AT_EnableAlwaysTrig", "AT_EnableReplicaTrig", "AT_DisableTrig", "AT_EnableTrigAll",
        "AT_DisableTrigAll", "AT_EnableTrigUser", "AT_DisableTrigUser")}
# Settings that switch triggers off (or make the server forget whose change it is).
TRIGGER_SETTINGS = {"session_replication_role"}
TRANSACTION_WORDS = {
    "TRANS_STMT_BEGIN": "begins a transaction", "TRANS_STMT_START": "begins a transaction",
    "TRANS_STMT_COMMIT": "commits the transaction", "TRANS_STMT_ROLLBACK": "rolls the transaction back",
    "TRANS_STMT_SAVEPOINT": "sets a savepoint", "TRANS_STMT_RELEASE": "releases a savepoint",
    "TRANS_STMT_ROLLBACK_TO": "rolls back to a savepoint",
    "TRANS_STMT_PREPARE": "prepares the transaction for two-phase commit",
    "TRANS_STMT_COMMIT_PREPARED": "commits the transaction", "TRANS_STMT_ROLLBACK_PREPARED":
    "rolls the transaction back"}
OTHER_VERBS = {
    "AlterTableStmt": "alters table {table}", "CreateStmt": "creates table {table}",
    "CreateTableAsStmt": "creates {table} from a query", "GrantStmt": "changes privileges",
    "GrantRoleStmt": "changes role memberships", "CopyStmt": "copies rows in or out (COPY)",
    "DoStmt": "runs a code block (DO)", "CallStmt": "calls a procedure", "IndexStmt": "creates an index",
    "ViewStmt": "creates a view", "RenameStmt": "renames something", "VacuumStmt": "vacuums",
    "LockStmt": "locks tables", "NotifyStmt": "sends a notification", "PrepareStmt": "prepares a statement",
    "ExecuteStmt": "runs a prepared statement the Recorder cannot see",
    "RefreshMatViewStmt": "refreshes a materialized view", "CreateFunctionStmt": "creates a function",
    "CreateSchemaStmt": "creates a schema", "CreateTrigStmt": "creates a trigger",
    "CreateRoleStmt": "creates a role", "AlterRoleStmt": "alters a role", "DropRoleStmt": "drops a role",
    "CommentStmt": "changes a comment", "CreateExtensionStmt": "creates an extension",
    "AlterSystemStmt": "changes the server's configuration", "DropOwnedStmt": "drops what a role owns",
    "ReassignOwnedStmt": "reassigns what a role owns", "ClusterStmt": "reorders a table (CLUSTER)",
    "ReindexStmt": "rebuilds indexes", "DiscardStmt": "discards session state", "ListenStmt": "listens",
    "UnlistenStmt": "stops listening", "LoadStmt": "loads a shared library", "CheckPointStmt": "checkpoints",
    "CreateSeqStmt": "creates a sequence", "AlterSeqStmt": "alters a sequence",
    "CreatedbStmt": "creates a database", "DropdbStmt": "drops a database", "RuleStmt": "creates a rule",
    "CreatePolicyStmt": "creates a row security policy", "AlterPolicyStmt": "alters a row security policy",
    "DeallocateStmt": "forgets a prepared statement", "DeclareCursorStmt": "declares a cursor",
    "FetchStmt": "fetches from a cursor", "ClosePortalStmt": "closes a cursor",
}
WRITES = (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt)
WRITE_VERBS = {"InsertStmt": "inserts rows into", "UpdateStmt": "updates rows of",
               "DeleteStmt": "deletes rows of", "MergeStmt": "merges rows into"}


def table_name(relation: ast.RangeVar) -> str:
    return f"{relation.schemaname}.{relation.relname}" if relation.schemaname else relation.relname


def dotted(names) -> str:
    return ".".join(getattr(n, "sval", "") or "" for n in names or ())


_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*\Z")


def function_name(names) -> str:
    """A called function's name as the catalogue is asked of it: `lower`, `pg_catalog.lower`; a part that
    only quotes make a name (`"COUNT"`, `"pg_catalog.abs"`) is kept quoted, so it matches no built-in."""
    parts = [getattr(n, "sval", "") or "" for n in names or ()]
    return ".".join(p if _PLAIN_NAME.match(p) else '"' + p.replace('"', '""') + '"' for p in parts)


class _Facts(Visitor):
    """Everything a statement's tree names: the tables it writes (with their CTE names set aside), the
    functions it calls, and whether it reaches into the capture."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []
        self.whole: list[str] = []
        self.functions: list[str] = []
        self.capture: list[str] = []
        self.verbs: list[str] = []
        self.relations: list[str] = []

    def visit_RangeVar(self, ancestors, node):
        if node.schemaname == CAPTURE_SCHEMA:
            self.capture.append(table_name(node))
        self.relations.append(table_name(node))

    def visit_FuncCall(self, ancestors, node):
        name = function_name(node.funcname)
        if name.split(".")[0] == CAPTURE_SCHEMA:
            self.capture.append(name)
        if name.lower().removeprefix("pg_catalog.") in SETTING_FUNCTIONS and _capture_setting(node):
            self.capture.append(f"the capture's settings (through {name}())")
        self.functions.append(name)

    def visit_A_Expr(self, ancestors, node):  # an operator is a function by another name
        name = dotted(node.name) if isinstance(node.name, tuple) else ""
        if name and not name.replace(" ", "").isalpha():  # BETWEEN, NOT BETWEEN… are words, not operators
            self.functions.append(f"operator {name}")

    def visit_VariableSetStmt(self, ancestors, node):  # SET, SET LOCAL, RESET; ALTER ROLE … SET
        if (node.name or "").lower().startswith(f"{CAPTURE_SCHEMA}."):
            self.capture.append(f"the setting {node.name}")

    def _write(self, node):
        name = table_name(node.relation)
        self.writes.append(name)
        self.verbs.append(f"{WRITE_VERBS[type(node).__name__]} {name}")
        if isinstance(node, ast.DeleteStmt) and not node.usingClause and not _reads_rows(node.whereClause):
            self.whole.append(name)
            self.verbs[-1] = f"deletes every row of {name}"

    visit_InsertStmt = visit_UpdateStmt = visit_DeleteStmt = visit_MergeStmt = (
        lambda self, ancestors, node: self._write(node))


class _Columns(Visitor):
    def __init__(self):
        super().__init__()
        self.found = False

    def visit_ColumnRef(self, ancestors, node):
        self.found = True


def _reads_rows(condition) -> bool:
    """Whether a DELETE's condition reads anything of a row: `WHERE true`, `WHERE 1 = 1` and no WHERE at all
    take every row of the table (or none)."""
    if condition is None:
        return False
    columns = _Columns()
    columns(condition)
    return columns.found


def _facts(node) -> _Facts:
    facts = _Facts()
    facts(node)
    return facts


def shown(function: str) -> str:
    """`lower()`, or `operator ###` as it is."""
    return function if function.startswith("operator ") else function + "()"


def _unsafe(functions: list[str], safe: Collection[str] | None) -> tuple[str, ...]:
    """The functions that may change data: of those the catalogue cleared (`safe`, by the name as called),
    or without a catalogue, of the harmless built-ins known by name."""
    known = SAFE_FUNCTIONS | {f"operator {o}" for o in SAFE_OPERATORS} if safe is None else {
        name.lower() for name in safe}
    return tuple(dict.fromkeys(f for f in functions if f.lower() not in known and (
        safe is not None or f.lower().removeprefix("pg_catalog.") not in known)))


def writes_in(text: str) -> list[str] | None:
    """The tables a text's statements write (a trigger function's, say), or None when the grammar cannot
    read it."""
    try:
        raw = parse_sql(text)
    except (ParseError, RecursionError, MemoryError, ValueError):
        return None
    return list(dict.fromkeys(t for stmt in raw for t in _facts(stmt.stmt).writes))


def unsafe_of(functions: list[str]) -> tuple[str, ...]:
    """Of `functions`, those not known by name to change nothing (without asking the catalogue)."""
    return _unsafe(functions, None)


def backslashed(text: str) -> bool:
    """Whether a plain quoted string ('…', not E'…' or $$…$$) holds a backslash: what ends it, and so what
    the statements are, then hangs on a setting of the session the Recorder cannot see."""
    try:
        tokens = scan(text)
    except (ParseError, RecursionError, ValueError):
        return False  # the grammar cannot read it: the reading says so
    for token in tokens:
        if token.name == "SCONST":
            piece = text[token.start:token.end + 1]  # pglast gives offsets in characters, not bytes
            if piece[:1] in ("'", "N", "n") and "\\" in piece:
                return True
    return False


# In what `read` is told a statement uses: PostgreSQL could not be asked (`resolving`, `catalogue`).
UNRESOLVED = "(unresolved)"


def writes_of(node) -> list[str]:
    """The tables a parsed statement (or part of one) writes."""
    return _facts(node).writes


def names_in(text: str) -> tuple[list[str], list[str]]:
    """The functions a text calls and the relations it names (a view's definition, say), as written; two
    empty lists when the grammar cannot read it."""
    try:
        raw = parse_sql(text)
    except (ParseError, RecursionError, MemoryError, ValueError):
        return [], []
    functions, relations = [], []
    for stmt in raw:
        facts = _facts(stmt.stmt)
        functions += facts.functions
        relations += facts.relations
    return list(dict.fromkeys(functions)), list(dict.fromkeys(relations))


def _object_name(obj) -> str:
    if isinstance(obj, tuple):
        return dotted(obj)
    if isinstance(obj, ast.ObjectWithArgs):
        return dotted(obj.objname)
    if isinstance(obj, ast.TypeName):
        return dotted(obj.names)
    return getattr(obj, "sval", "") or ""


SETTING_FUNCTIONS = {"set_config"}


def _capture_setting(node: ast.FuncCall) -> bool:
    """A set_config() of the capture's own settings, or of a setting named as it runs (which may be one)."""
    first = (node.args or (None,))[0]
    value = getattr(getattr(first, "val", None), "sval", None)
    return not isinstance(value, str) or value.lower().startswith(f"{CAPTURE_SCHEMA}.")


def _capture_trigger(stmt) -> bool:
    """A statement that drops, renames or switches a trigger of the capture, or all of a table's."""
    if isinstance(stmt, ast.AlterTableStmt):
        return any(isinstance(cmd, ast.AlterTableCmd) and cmd.subtype in TRIGGER_SWITCHES
                   for cmd in stmt.cmds or ())
    if isinstance(stmt, ast.DropStmt) and stmt.removeType in (enums.ObjectType.OBJECT_TRIGGER,
                                                              enums.ObjectType.OBJECT_EVENT_TRIGGER):
        return any(_object_name(o).split(".")[-1].startswith(CAPTURE_TRIGGER) for o in stmt.objects or ())
    if isinstance(stmt, ast.RenameStmt) and stmt.renameType in (enums.ObjectType.OBJECT_TRIGGER,
                                                                enums.ObjectType.OBJECT_SCHEMA):
        return (stmt.subname or "").startswith(CAPTURE_TRIGGER)
    if isinstance(stmt, ast.AlterEventTrigStmt):
        return (stmt.trigname or "").startswith(CAPTURE_TRIGGER)
    if isinstance(stmt, ast.DropStmt):  # the capture's schema, or anything in it
        return any(_object_name(o).split(".")[0] == CAPTURE_SCHEMA for o in stmt.objects or ())
    return isinstance(stmt, ast.VariableSetStmt) and (stmt.name or "") in TRIGGER_SETTINGS


def _drop(stmt: ast.DropStmt) -> Statement:
    what = enums.ObjectType(stmt.removeType).name.removeprefix("OBJECT_").lower().replace("_", " ")
    names = [_object_name(o) for o in stmt.objects or ()]
    tables = tuple(names) if stmt.removeType == enums.ObjectType.OBJECT_TABLE else ()
    cascade = " with everything that depends on it (CASCADE)" if stmt.behavior == \
        enums.DropBehavior.DROP_CASCADE else ""
    verb = f"drops {what} {named(names)}{cascade}"
    return Statement("destroy", verb, destroys=tables, reason=f"it {verb}: a table's definition and rows "
                     "are not rows a capture can put back" if tables else f"it {verb}")


def _other(stmt, text: str) -> Statement:
    if isinstance(stmt, ast.DropStmt):
        return _drop(stmt)
    if isinstance(stmt, ast.TruncateStmt):
        tables = tuple(table_name(r) for r in stmt.relations or ())
        verb = f"empties {named(tables)} (TRUNCATE)"
        return Statement("destroy", verb, destroys=tables,
                         reason=f"it {verb}, which no row trigger sees")
    if isinstance(stmt, ast.VariableSetStmt):
        verb = (f"changes the session's {stmt.name.replace('_', ' ')}" if stmt.name else "changes settings")
        return Statement("destroy", verb, reason=f"it {verb}, which nothing records")
    if isinstance(stmt, ast.CallStmt):
        verb = f"calls procedure {dotted(stmt.funccall.funcname)}"
        return Statement("destroy", verb, reason=f"it {verb}, which may change anything")
    relation = getattr(stmt, "relation", None) or getattr(getattr(stmt, "into", None), "rel", None)
    template = OTHER_VERBS.get(type(stmt).__name__, "runs {kind}")
    verb = template.format(table=table_name(relation) if isinstance(relation, ast.RangeVar) else "a table",
                           kind=type(stmt).__name__.removesuffix("Stmt"))
    return Statement("destroy", verb, reason=f"it {verb}: not a change of rows a capture can put back")


def _analyzes(option) -> bool:
    """An EXPLAIN option that runs the statement: `ANALYZE`, `(ANALYZE)`, `(ANALYZE true)`."""
    if getattr(option, "defname", "") != "analyze":
        return False
    value = getattr(option, "arg", None)
    return value is None or str(getattr(value, "sval", getattr(value, "boolval", "true"))).lower() not in (
        "false", "off", "0")


def _explained(stmt: ast.ExplainStmt, text: str, safe: Collection[str] | None,
               views: Mapping[str, str] = {}) -> Statement:
    """EXPLAIN only plans its statement; EXPLAIN ANALYZE runs it, and is what it runs."""
    if not any(_analyzes(option) for option in stmt.options or ()):
        return Statement("read", "explains a query", text)
    inner = _statement(stmt.query, text, safe, views)
    return Statement(inner.kind, f"runs and explains: {inner.verb}", text, writes=inner.writes,
                     destroys=inner.destroys, whole_table=inner.whole_table, functions=inner.functions,
                     reason=inner.reason)


def _unsafe_views(facts: _Facts, views: Mapping[str, str]) -> list[str]:
    """What makes each view (or policed table) the statement reads change data, in words ("view active,
    whose definition calls purge()")."""
    return [views[name] for name in dict.fromkeys(facts.relations) if name in views]


def _statement(stmt, text: str, safe: Collection[str] | None, views: Mapping[str, str] = {}) -> Statement:
    """One statement's kind and verb."""
    facts = _facts(stmt)
    if facts.capture or _capture_trigger(stmt):
        where = named(facts.capture) if facts.capture else "the capture's triggers"
        return Statement("refused", "touches the capture", text,
                         reason=f"it touches {where}, part of the capture that keeps the rows agents change")
    unsafe = _unsafe(facts.functions, safe)
    if isinstance(stmt, ast.ExplainStmt):
        return _explained(stmt, text, safe, views)
    if isinstance(stmt, ast.TransactionStmt):
        return Statement("read", TRANSACTION_WORDS.get(enums.TransactionStmtKind(stmt.kind).name,
                                                       "controls the transaction"), text)
    if isinstance(stmt, ast.SelectStmt) and stmt.intoClause is not None:
        verb = f"creates table {table_name(stmt.intoClause.rel)} from a query (SELECT … INTO)"
        return Statement("destroy", verb, text, reason=f"it {verb}")
    if isinstance(stmt, (ast.SelectStmt, ast.VariableShowStmt, *WRITES)):
        if facts.writes or isinstance(stmt, WRITES):
            base = Statement("rows", "; ".join(dict.fromkeys(facts.verbs)), text,
                             writes=tuple(dict.fromkeys(facts.writes)), whole_table=bool(facts.whole),
                             destroys=tuple(dict.fromkeys(facts.whole)))
        else:
            base = Statement("read", "reads" if isinstance(stmt, ast.SelectStmt) else "shows a setting", text)
        if unsafe:
            verb = f"{base.verb}, calling {named([shown(f) for f in unsafe])}"
            return Statement("destroy", verb, text, writes=base.writes, destroys=base.destroys,
                             whole_table=base.whole_table, functions=unsafe, reason=(
                                 f"it calls {named([shown(f) for f in unsafe])}, which may change data that "
                                 "no capture sees"))
        if through := _unsafe_views(facts, views):
            verb = f"{base.verb}, through {named(through)}"
            return Statement("destroy", verb, text, writes=base.writes, destroys=base.destroys,
                             whole_table=base.whole_table, reason=(
                                 f"it reads {named(through)}, which may change data that no capture sees"))
        return base
    other = _other(stmt, text)
    return Statement(other.kind, other.verb, text, destroys=other.destroys, functions=unsafe,
                     reason=other.reason)


def read(text: str, *, safe: Collection[str] | None = None, views: Mapping[str, str] = {},
         hidden: Mapping[int, Collection[str]] = {}) -> Reading:
    """Every statement of `text`, in order. `safe`: the functions (by the name as called) the catalogue says
    change nothing, or None to go by the harmless built-ins' names alone; `views`: the views whose
    definitions may change data and the tables whose row security policies may, each with why in words
    ("view tidy_contacts, whose definition calls purge()"); `hidden`: by statement (its index), what it
    uses outside the built-ins as PostgreSQL resolved it (`shout()` called by column notation, `operator
    ###`, `domain evil_int`), none of which is trusted to change nothing."""
    try:
        raw = parse_sql(text)
    except ParseError as exc:
        return Reading("postgresql", problem=f"PostgreSQL's grammar cannot read it: {exc}")
    except (RecursionError, MemoryError, ValueError) as exc:
        return Reading("postgresql", problem=f"it cannot be read: {type(exc).__name__}")
    if backslashed(text):
        return Reading("postgresql", (Statement("refused", "has a backslash in a quoted string", reason=(
            "it has a backslash inside a plain quoted string, which PostgreSQL reads one way or the other as "
            "the session's standard_conforming_strings says (with it off, 'a\\' , ' ends in another place "
            "and what follows is other statements); write such a string as E'…', or without the "
            "backslash")),))
    statements = []
    for index, stmt in enumerate(raw):
        # pglast gives a statement's place in characters (libpg_query's bytes, converted).
        end = stmt.stmt_location + stmt.stmt_len if stmt.stmt_len else len(text)
        piece = text[stmt.stmt_location:end].strip()
        statement = _statement(stmt.stmt, piece, safe, views)
        uses = sorted(set(hidden.get(index, ())) - {UNRESOLVED})
        if UNRESOLVED in hidden.get(index, ()) and statement.kind in ("read", "rows"):
            statement = Statement(
                "destroy", f"{statement.verb}, evaluating what PostgreSQL could not be asked about", piece,
                writes=statement.writes, destroys=statement.destroys, whole_table=statement.whole_table,
                reason="PostgreSQL could not be asked what it evaluates (it would not make a view of it), so "
                       "a function it calls, which may change data that no capture sees, could go unseen")
        elif uses and statement.kind in ("read", "rows"):
            verb = f"{statement.verb}, using {named(uses)}"
            statement = Statement(
                "destroy", verb, piece, writes=statement.writes, destroys=statement.destroys,
                whole_table=statement.whole_table, functions=tuple(uses),
                reason=f"it uses {named(uses)}, defined in the database, which may change data that no "
                       "capture sees")
        statements.append(statement)
    return Reading("postgresql", tuple(transaction_control_among_others(statements)))
