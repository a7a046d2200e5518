"""The capture: row-level triggers that keep every changed row's before and after images, with what
identifies the change, in the same transaction as the change itself (cascades and other triggers' changes
included, since each fires its table's own trigger). The established way (pgMemento, E-Maj, supa_audit):
logical decoding would see every writer too, but needs a replication slot, `wal_level=logical` and a
decoder the agent's server knows nothing of, and it cannot say, inside the transaction, which rows a call
changed; a trigger can, and it is what an admin can read and a DBA can run by hand (`manage.py capture
--sql`). This module writes that SQL; `journal.upstream.database` runs it. No ORM and no clock.

PostgreSQL: a schema of its own (`undo_capture`), owned by the Recorder's role; the trigger function is
`SECURITY DEFINER`, so the agent's role writes the capture only through its triggers and can read, change
or drop none of it; an event trigger (installed when the Recorder's role may) refuses any statement that
drops or switches off a capture trigger without dropping its table. SQLite: tables and triggers named
`_undo_capture…` in the database file itself (a file has no roles): what keeps them from the agent is that
every statement it sends is read first and any that touches them is refused (`reading`).
"""

from collections.abc import Sequence

from .reading import CAPTURE_SCHEMA, CAPTURE_TRIGGER, SQLITE_PREFIX

CHANGES = f"{CAPTURE_SCHEMA}.changes"
SQLITE_CHANGES = f"{SQLITE_PREFIX}_changes"
SQLITE_TABLES = f"{SQLITE_PREFIX}_tables"
SQLITE_APPLIED = f"{SQLITE_PREFIX}_applied"
APPLIED = f"{CAPTURE_SCHEMA}.applied"
GUARD = f"{CAPTURE_TRIGGER}_guard"


# Set (SET LOCAL) in the Recorder's own undo transaction: its restored rows are not captured again.
RESTORING = f"SELECT set_config('{CAPTURE_SCHEMA}.restoring', 'on', true)"


def quoted(name: str) -> str:
    """An identifier, quoted for either dialect."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def qualified(table: str) -> str:
    """`public.contacts` → "public"."contacts"."""
    return ".".join(quoted(part) for part in table.split(".", 1))


# -- PostgreSQL ----------------------------------------------------------------------------------------------

POSTGRESQL_BASE = f"""
CREATE SCHEMA IF NOT EXISTS {CAPTURE_SCHEMA};
REVOKE ALL ON SCHEMA {CAPTURE_SCHEMA} FROM PUBLIC;
CREATE TABLE IF NOT EXISTS {CHANGES} (
    id bigserial PRIMARY KEY,
    txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    who name NOT NULL DEFAULT session_user,
    pid integer NOT NULL DEFAULT pg_backend_pid(),
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    tbl text NOT NULL,
    op "char" NOT NULL,
    pk jsonb NOT NULL,
    before jsonb,
    after jsonb
);
CREATE TABLE IF NOT EXISTS {CAPTURE_SCHEMA}.agents (role name PRIMARY KEY);
CREATE TABLE IF NOT EXISTS {CAPTURE_SCHEMA}.applied (
    marker text PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail jsonb NOT NULL
);
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $capture$
DECLARE
    old_row jsonb;
    new_row jsonb;
    key jsonb := '[]';
    name text;
BEGIN
    -- The Recorder's own undo (its login, owning this schema, saying so in its transaction) is journaled as a
    -- step of its own; every other writer's rows are kept, whatever it sets.
    IF coalesce(current_setting('{CAPTURE_SCHEMA}.restoring', true), '') = 'on' AND session_user = (
        SELECT nspowner::regrole::name FROM pg_namespace WHERE nspname = '{CAPTURE_SCHEMA}') THEN
        RETURN NULL;
    END IF;
    IF TG_OP <> 'INSERT' THEN old_row := to_jsonb(OLD); END IF;
    IF TG_OP <> 'DELETE' THEN new_row := to_jsonb(NEW); END IF;
    FOREACH name IN ARRAY TG_ARGV LOOP
        key := key || jsonb_build_array(coalesce(old_row, new_row) -> name);
    END LOOP;
    INSERT INTO {CHANGES} (tbl, op, pk, before, after)
    VALUES (TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, left(TG_OP, 1), key, old_row, new_row);
    RETURN NULL;
END
$capture$;
REVOKE ALL ON FUNCTION {CAPTURE_SCHEMA}.record() FROM PUBLIC;
"""

# Drops, renames and switches of a capture trigger that do not drop its table, refused by the database itself
# (an event trigger needs a superuser to install: without one the statement reader's refusal stands alone).
POSTGRESQL_GUARD = f"""
CREATE OR REPLACE FUNCTION {CAPTURE_SCHEMA}.guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
    gone record;
BEGIN
    IF TG_EVENT = 'sql_drop' THEN
        FOR gone IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
            -- A trigger's identity is "name on schema.table"; a dropped table's triggers are not original.
            -- The capture's owner (the Recorder's login) puts its own triggers in place again.
            IF gone.original AND (gone.object_type = 'trigger'
                                  AND gone.object_identity LIKE '{CAPTURE_TRIGGER} on %'
                                  OR gone.schema_name = '{CAPTURE_SCHEMA}') AND session_user <> (
                                      SELECT nspowner::regrole::name FROM pg_namespace
                                      WHERE nspname = '{CAPTURE_SCHEMA}') THEN
                RAISE EXCEPTION 'the undo capture is not yours to drop (%)', gone.object_identity;
            END IF;
        END LOOP;
    ELSIF EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = '{CAPTURE_TRIGGER}' AND tgenabled <> 'O') THEN
        RAISE EXCEPTION 'the undo capture''s triggers cannot be switched off';
    END IF;
END
$guard$;
DROP EVENT TRIGGER IF EXISTS {GUARD};
CREATE EVENT TRIGGER {GUARD} ON sql_drop EXECUTE FUNCTION {CAPTURE_SCHEMA}.guard();
DROP EVENT TRIGGER IF EXISTS {GUARD}_switch;
CREATE EVENT TRIGGER {GUARD}_switch ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'ALTER TRIGGER')
    EXECUTE FUNCTION {CAPTURE_SCHEMA}.guard();
"""


def postgresql_table(table: str, key: Sequence[str]) -> str:
    """The capture trigger of one table, keyed by its primary key's columns."""
    arguments = ", ".join(literal(column) for column in key)
    return (f"DROP TRIGGER IF EXISTS {CAPTURE_TRIGGER} ON {qualified(table)};\n"
            f"CREATE TRIGGER {CAPTURE_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {qualified(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION {CAPTURE_SCHEMA}.record({arguments});\n")


def postgresql(tables: dict[str, Sequence[str]], *, recorder: str, agent_roles: Sequence[str] = (),
               guard: bool = True) -> str:
    """Everything, in order, for `tables` ({table: key columns}): the schema (owned by the Recorder's role),
    each table's trigger, and the guard."""
    owner = f"ALTER SCHEMA {CAPTURE_SCHEMA} OWNER TO {quoted(recorder)};\n" if recorder else ""
    denied = "".join(f"REVOKE ALL ON SCHEMA {CAPTURE_SCHEMA} FROM {quoted(role)};\n"
                     f"INSERT INTO {CAPTURE_SCHEMA}.agents (role) VALUES ({literal(role)}) "
                     "ON CONFLICT DO NOTHING;\n"
                     for role in agent_roles)
    triggers = "".join(postgresql_table(table, key) for table, key in sorted(tables.items()))
    # The guard first: an earlier guard would refuse the re-install of a capture trigger, this one lets the
    # capture's owner do it.
    return POSTGRESQL_BASE + owner + denied + (POSTGRESQL_GUARD if guard else "") + triggers


# -- SQLite --------------------------------------------------------------------------------------------------

SQLITE_BASE = f"""
CREATE TABLE IF NOT EXISTS {SQLITE_CHANGES} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    tbl TEXT NOT NULL,
    op TEXT NOT NULL,
    pk TEXT NOT NULL,
    before TEXT,
    after TEXT
);
CREATE TABLE IF NOT EXISTS {SQLITE_TABLES} (
    tbl TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    columns TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS {SQLITE_APPLIED} (
    marker TEXT PRIMARY KEY,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    detail TEXT NOT NULL
);
"""


def _sqlite_value(row: str, column: str) -> str:
    """A column's value as JSON can hold it: a BLOB as {"$blob": hex}."""
    value = f"{row}.{quoted(column)}"
    return f"CASE WHEN typeof({value}) = 'blob' THEN json_object('$blob', hex({value})) ELSE {value} END"


def sqlite_image(row: str, columns: Sequence[str]) -> str:
    return "json_object(" + ", ".join(f"{literal(c)}, {_sqlite_value(row, c)}" for c in columns) + ")"


def sqlite_table(table: str, key: Sequence[str], columns: Sequence[str]) -> str:
    """The three capture triggers of one table, and its line in the capture's list of tables."""
    name = quoted(table)

    def key_of(row: str) -> str:
        return "json_array(" + ", ".join(_sqlite_value(row, c) for c in key) + ")"

    insert = f"INSERT INTO {SQLITE_CHANGES} (tbl, op, pk, before, after) VALUES ({literal(table)}, "
    triggers = {
        "i": ("INSERT", f"{insert}'I', {key_of('NEW')}, NULL, {sqlite_image('NEW', columns)});"),
        "u": ("UPDATE", f"{insert}'U', {key_of('OLD')}, {sqlite_image('OLD', columns)}, "
                        f"{sqlite_image('NEW', columns)});"),
        "d": ("DELETE", f"{insert}'D', {key_of('OLD')}, {sqlite_image('OLD', columns)}, NULL);"),
    }
    # A row SQLite is about to replace (INSERT OR REPLACE, REPLACE, UPDATE OR REPLACE, or a table's ON
    # CONFLICT REPLACE, on its primary key) is deleted without telling the delete triggers: a marker ('R',
    # with the row as it was) kept just before, so the call's rows show a hidden delete (`windows`). An
    # insert ignored or turned into an update afterwards (OR IGNORE, ON CONFLICT DO UPDATE) leaves a marker
    # that no insert of the same key follows, which says nothing.
    same = " AND ".join(f"{quoted(c)} IS NEW.{quoted(c)}" for c in key)
    moved = " OR ".join(f"NEW.{quoted(c)} IS NOT OLD.{quoted(c)}" for c in key)
    existing = f"(SELECT {sqlite_image(name, columns)} FROM {name} WHERE {same})"
    marker = f"{insert}'R', {key_of('NEW')}, {existing}, NULL);"
    triggers["r"] = ("INSERT", marker,
                     f"BEFORE INSERT ON {name} WHEN EXISTS (SELECT 1 FROM {name} WHERE {same})")
    triggers["k"] = ("UPDATE", marker, f"BEFORE UPDATE ON {name} WHEN ({moved}) AND EXISTS (SELECT 1 FROM "
                                       f"{name} WHERE {same})")
    sql = "".join(f"DROP TRIGGER IF EXISTS {quoted(trigger_name(table, op))};\n"
                  f"CREATE TRIGGER {quoted(trigger_name(table, op))} "
                  f"{when[0] if when else f'AFTER {event} ON {name}'} BEGIN {body} END;\n"
                  for op, (event, body, *when) in triggers.items())
    return sql + (f"INSERT OR REPLACE INTO {SQLITE_TABLES} (tbl, key, columns) VALUES ({literal(table)}, "
                  f"{literal(_json_list(key))}, {literal(_json_list(columns))});\n")


def trigger_name(table: str, op: str) -> str:
    return f"{SQLITE_PREFIX}_{table}_{op}"


def _json_list(names: Sequence[str]) -> str:
    return "[" + ", ".join('"' + n.replace("\\", "\\\\").replace('"', '\\"') + '"' for n in names) + "]"


def sqlite(tables: dict[str, tuple[Sequence[str], Sequence[str]]]) -> str:
    """Everything, in order, for `tables` ({table: (key columns, all columns)})."""
    return SQLITE_BASE + "".join(sqlite_table(table, key, columns)
                                 for table, (key, columns) in sorted(tables.items()))
