"""What PostgreSQL's catalogue says of what an agent's text uses, for the reading of it
(`journal.upstream.database`): which functions and operators change nothing (a user's never trusted for
the volatility it declares), what each SELECT uses as PostgreSQL itself resolves it (a temporary view,
rolled back, and its dependencies), which views and row security policies may change data, and the search
path the agent's role reads names on. Synchronous, on the Recorder's own connection; asked only of
PostgreSQL."""

from collections.abc import Sequence

import psycopg
import psycopg.sql

from ..undo.database import capture, postgres, resolving
from ..undo.database import reading as readings
from ..undo.database.places import POSTGRESQL
from ..undo.database.reading import CAPTURE_SCHEMA

PG_FUNCTIONS = """
SELECT f,
       EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE p.proname = lower(split_part(f, '.', -1))
                 AND (strpos(f, '.') = 0 OR n.nspname = lower(split_part(f, '.', 1)))) AS known,
       EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE p.proname = lower(split_part(f, '.', -1))
                 AND (strpos(f, '.') = 0 OR n.nspname = lower(split_part(f, '.', 1)))
                 AND n.nspname <> 'pg_catalog'
                 AND (pg_get_userbyid(p.proowner) = ANY(%s::text[])
                      OR NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                                     AND d.objid = p.oid AND d.deptype = 'e'))) AS users,
       EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE p.proname = lower(split_part(f, '.', -1))
                 AND (strpos(f, '.') = 0 OR n.nspname = lower(split_part(f, '.', 1)))
                 AND p.provolatile = 'v') AS volatile
FROM unnest(%s::text[]) f
"""
PG_VIEWS = """
SELECT f, pg_get_viewdef(to_regclass(f)) FROM unnest(%s::text[]) f
WHERE (SELECT relkind FROM pg_class WHERE oid = to_regclass(f)) = 'v'
"""
VIEWS_FOLLOWED = 100  # views read through views, at most, before the rest are taken to change data


def safe_functions(connection, functions: Sequence[str], listed: Sequence[str] = (),
                   used: set[str] | None = None) -> set[str]:
    """Of `functions` (as called: `lower`, `public.tidy`, `operator ###`), those that change nothing, by
    every function (or operator) of that name in the catalogue, whatever its argument types: none may be a
    user's (outside pg_catalog and not an extension's) unless an admin listed the name as safe (`listed`:
    `tidy` or `public.tidy`), and each built-in function must be immutable or stable, or one of the harmless
    volatile ones known by name (`postgres.SAFE_FUNCTIONS`). A user's function is never trusted for its
    volatility: a STABLE function may call a volatile one. A name only quotes make (`"COUNT"`) is no
    built-in's. Where a user's function shares a built-in's name, the call is the built-in when PostgreSQL
    resolved one SELECT's calls with their arguments' types and used no user's function of that name
    (`used`: `users_objects_used`); otherwise it is taken to be the user's."""
    if connection.dialect != POSTGRESQL or not functions:
        return set()
    allowed = {name.lower() for name in listed}
    named_ = [f for f in functions if not f.startswith("operator ") and '"' not in f]
    safe = {f for f in functions if f.lower() in allowed} | _safe_operators(connection, functions, used)
    if not named_:
        return safe
    for name, known, users, volatile in connection.rows(PG_FUNCTIONS, (agent_roles(connection), named_)):
        bare = name.lower().split(".")[-1]
        builtin = known and (not volatile or bare in postgres.SAFE_FUNCTIONS)
        if bare in allowed or builtin and (not users or used is not None and f"{bare}()" not in used):
            safe.add(name)
    return safe


def _safe_operators(connection, functions: Sequence[str], used: set[str] | None) -> set[str]:
    """The operators among `functions` (`operator ###`) no user's operator shares a name with, or that
    PostgreSQL resolved to no user's in a SELECT (`used`)."""
    operators = [f.removeprefix("operator ") for f in functions if f.startswith("operator ")]
    if not operators:
        return set()
    return {f"operator {operator}" for operator, users in connection.rows(PG_OPERATORS, (operators,))
            if not users or used is not None and f"operator {operator}" not in used}


PG_OPERATORS = """
SELECT o, EXISTS (SELECT 1 FROM pg_operator p JOIN pg_namespace n ON n.oid = p.oprnamespace
                  WHERE p.oprname = o AND n.nspname <> 'pg_catalog'
                    AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_operator'::regclass
                                    AND d.objid = p.oid AND d.deptype = 'e'))
FROM unnest(%s::text[]) o
"""
# What each temporary view (`undo_capture_resolve_N`, of one SELECT) depends on outside the built-ins (which
# are pinned, so never listed) and the extensions: the user's functions (called by name, by column notation,
# behind an operator), its operators, and its domains (and arrays of them) whose checks or default call a
# function or operator of the database's own (a domain whose check uses only built-ins changes nothing).
# `{agents}`: the agents' roles, as a literal (the query goes with the views' creation, in one text, so it has
# no parameters).
PG_USED = """
WITH deps AS (
    SELECT c.relname AS view, d.refclassid, d.refobjid FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
    JOIN pg_class c ON c.oid = r.ev_class
    WHERE d.classid = 'pg_rewrite'::regclass AND c.relnamespace = pg_my_temp_schema()
      AND c.relname LIKE 'undo\\_capture\\_resolve\\_%'
      AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.classid = d.refclassid AND e.objid = d.refobjid
                      AND e.deptype = 'e'
                      AND NOT (e.classid = 'pg_proc'::regclass AND EXISTS (
                          SELECT 1 FROM pg_proc a WHERE a.oid = e.objid
                          AND pg_get_userbyid(a.proowner) = ANY({agents}::text[])))))
SELECT view, p.proname || '()', n.nspname || '.' || p.proname
FROM deps JOIN pg_proc p ON p.oid = deps.refobjid JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE deps.refclassid = 'pg_proc'::regclass
UNION ALL
SELECT view, 'operator ' || o.oprname, 'operator ' || o.oprname FROM deps
JOIN pg_operator o ON o.oid = deps.refobjid WHERE deps.refclassid = 'pg_operator'::regclass
UNION ALL
SELECT view, 'domain ' || d.typname, 'domain ' || d.typname FROM deps JOIN pg_type t ON t.oid = deps.refobjid
JOIN pg_type d ON d.oid = CASE WHEN t.typtype = 'd' THEN t.oid ELSE t.typelem END AND d.typtype = 'd'
WHERE deps.refclassid = 'pg_type'::regclass AND (
    EXISTS (SELECT 1 FROM pg_constraint c JOIN pg_depend x ON x.classid = 'pg_constraint'::regclass
            AND x.objid = c.oid AND x.refclassid IN ('pg_proc'::regclass, 'pg_operator'::regclass)
            WHERE c.contypid = d.oid)
    OR EXISTS (SELECT 1 FROM pg_depend x WHERE x.classid = 'pg_type'::regclass AND x.objid = d.oid
               AND x.refclassid IN ('pg_proc'::regclass, 'pg_operator'::regclass)))
"""


def agent_roles(connection) -> list[str]:
    """The roles the capture names as the agents' (none before the capture is in place)."""
    try:
        return [role for (role,) in connection.rows(f"SELECT role FROM {CAPTURE_SCHEMA}.agents")]
    except psycopg.errors.UndefinedTable:
        return []


def users_objects_used(connection, selects: Sequence[tuple[int, str, bool]],
                       listed: Sequence[str] = ()) -> dict[int, set[str]] | None:
    """What each SELECT (`resolving.selects`: its statement's index, its text, whether it was derived from a
    row change) uses outside the built-ins and the extensions (an extension's function the agent owns,
    added to it, is the agent's), as PostgreSQL resolves it (a function's call with its arguments' types, a
    function called by column notation, an operator, a domain): `shout()`, `operator ###`, `domain
    evil_int`, but those an admin listed; by statement. Read from the dependencies of a temporary view made
    of each, in a transaction rolled back (a view is made, never run; each is pglast's own printing of
    parsed SQL, so nothing else can ride along), all in one round trip; when PostgreSQL will not make one of
    them, one by one. None when it will not make a view of a plain SELECT; for a row change whose SELECT it
    will not make a view of (or that could not be printed), `postgres.UNRESOLVED`: unknown, never passed
    by."""
    allowed = {name.lower() for name in listed}
    used_sql = PG_USED.format(agents=psycopg.sql.Literal(agent_roles(connection)).as_string(connection.raw))
    used: dict[int, set[str]] = {}
    asked = [(number, select) for number, select in enumerate(selects) if select[1] != resolving.UNRESOLVED]
    for index, _, _ in (select for select in selects if select[1] == resolving.UNRESOLVED):
        used.setdefault(index, set()).add(postgres.UNRESOLVED)
    try:
        found = _views_used(connection, asked, used_sql) if asked else []
    except psycopg.Error:
        found = []
        for number, select in asked:
            try:
                found += _views_used(connection, [(number, select)], used_sql)
            except psycopg.Error:
                if not select[2]:
                    return None
                used.setdefault(select[0], set()).add(postgres.UNRESOLVED)
    for number, shown, qualified in found:
        if shown.removesuffix("()") not in allowed and qualified.lower() not in allowed:
            used.setdefault(selects[number][0], set()).add(shown)
    return used


def _views_used(connection, selects: list[tuple[int, tuple[int, str, bool]]], used_sql: str) -> list[tuple]:
    """`(number, shown, qualified)` for what each SELECT's view uses: the views made, read and rolled back in
    one text (psycopg sends a text without parameters as one simple query: one round trip)."""
    made = "".join(f"CREATE TEMPORARY VIEW undo_capture_resolve_{number} AS SELECT 1 FROM ({select}) AS "
                   f"agents_select;\n" for number, (_, select, _) in selects)
    try:
        cursor = connection.raw.execute(f"BEGIN;\n{made}{used_sql};\nROLLBACK")
        rows = []
        while True:  # the results of each statement in turn: the query's are the rows
            if cursor.description is not None:
                rows = cursor.fetchall()
            if not cursor.nextset():
                break
    except psycopg.Error:
        connection.raw.execute("ROLLBACK")
        raise
    return [(int(view.rsplit("_", 1)[1]), shown, qualified) for view, shown, qualified in rows]


def unsafe_views(connection, relations: Sequence[str],
                 listed: Sequence[str] = ()) -> dict[str, str]:
    """The views among `relations`, and the views they read in turn, whose definitions call a function that
    may change data (`safe_functions`), and the tables whose row security policies call one, each with why
    in words ("view tidy_contacts, whose definition calls purge()")."""
    definitions, complete = _view_definitions(connection, relations)
    called = {f for calls, _ in definitions.values() for f in calls}
    safe = safe_functions(connection, sorted(called), listed)
    unsafe = {name: f"view {name}, whose definition calls "
                    + readings.named([postgres.shown(f) for f in calls if f not in safe])
              for name, (calls, _) in definitions.items() if any(f not in safe for f in calls)}
    unsafe.update(_policed(connection, [*relations, *definitions], listed))
    changed = True
    while changed:  # a view that reads an unsafe view (or table) is unsafe too
        changed = False
        for name, (_, reads) in definitions.items():
            through = next((r for r in reads if r in unsafe and r != name), None)
            if name not in unsafe and through is not None:
                unsafe[name], changed = f"view {name}, whose definition reads {unsafe[through]}", True
    if not complete:  # more views than are followed: the rest are not cleared
        for name in definitions:
            unsafe.setdefault(name, f"view {name}, which reads more views than the Recorder follows")
    return unsafe


PG_POLICED = """
SELECT DISTINCT f, pol.polname, n.nspname || '.' || p.proname
FROM unnest(%s::text[]) f JOIN pg_policy pol ON pol.polrelid = to_regclass(f)
JOIN pg_depend d ON d.classid = 'pg_policy'::regclass AND d.objid = pol.oid
JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
JOIN pg_namespace n ON n.oid = p.pronamespace
"""


def _policed(connection, relations: Sequence[str], listed: Sequence[str]) -> dict[str, str]:
    """The tables whose row security policies call a function outside the built-ins, in words."""
    allowed = {name.lower() for name in listed}
    found: dict[str, str] = {}
    for table, policy, function in connection.rows(PG_POLICED, (list(dict.fromkeys(relations)),)):
        if function.lower() not in allowed and function.split(".")[-1].lower() not in allowed:
            found.setdefault(table, f"table {table}, whose row security policy {policy} calls {function}()")
    return found


def _view_definitions(connection, relations: Sequence[str]) -> tuple[dict, bool]:
    """{view: (the functions its definition calls, the relations it reads)} for the views among `relations`
    and those they read, breadth first; and whether every one was followed (`VIEWS_FOLLOWED`)."""
    definitions: dict[str, tuple[list[str], list[str]]] = {}
    pending = list(dict.fromkeys(relations))
    while pending and len(definitions) < VIEWS_FOLLOWED:
        found = connection.rows(PG_VIEWS, (pending,))
        pending = []
        for name, definition in found:
            definitions[name] = postgres.names_in(definition or "")
            pending += [r for r in definitions[name][1] if r not in definitions]
    return definitions, not pending


PG_AGENT_PATH = """
SELECT r.rolname, coalesce(
    (SELECT substring(c FROM '^search_path=(.*)$') FROM pg_db_role_setting s, unnest(s.setconfig) c
     WHERE s.setrole = r.oid AND s.setdatabase IN (d.oid, 0) AND c LIKE 'search_path=%%'
     ORDER BY s.setdatabase DESC LIMIT 1),
    (SELECT substring(c FROM '^search_path=(.*)$') FROM pg_db_role_setting s, unnest(s.setconfig) c
     WHERE s.setrole = 0 AND s.setdatabase = d.oid AND c LIKE 'search_path=%%'),
    (SELECT boot_val FROM pg_settings WHERE name = 'search_path'))
FROM pg_roles r, pg_database d
WHERE r.rolname IN (SELECT role FROM undo_capture.agents) AND d.datname = current_database()
ORDER BY r.rolname LIMIT 1
"""


def as_the_agent(connection) -> None:
    """Read names as the agent's server will: the search path of the agent's role (the capture names it),
    `$user` its own schema, so a table or function of the agent's schema is the one the reading finds."""
    if connection.dialect != POSTGRESQL:
        return
    try:
        found = connection.rows(PG_AGENT_PATH)
    except psycopg.errors.UndefinedTable:
        return  # no capture yet: no role named
    if found:
        role, path = found[0]
        path = path.replace('"$user"', capture.quoted(role)).replace("$user", capture.quoted(role))
        connection.raw.execute(f"SELECT set_config('search_path', {capture.literal(path)}, false)")
