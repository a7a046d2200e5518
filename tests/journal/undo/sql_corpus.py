"""A corpus of SQL statements an agent may send, each with the kind it must be read as (`read`, `rows`,
`destroy`, `refused`, `unknown`), for PostgreSQL and SQLite: every statement kind the classifier knows,
wrapped in comments, quoting, stacked statements and case changes. Shared by the classifier's tests and
bench/sql_corpus.py, which prints how many writes were read as reads (the figure that must be 0)."""

import itertools

SQLITE_SCHEMA = [
    "CREATE TABLE contacts (id INTEGER PRIMARY KEY, email TEXT, status TEXT, company_id INTEGER)",
    "CREATE TABLE companies (id INTEGER PRIMARY KEY, name TEXT)",
    "CREATE TABLE notes (body TEXT)",
    "CREATE TABLE audit (id INTEGER PRIMARY KEY, what TEXT)",
    "CREATE TRIGGER contacts_audit AFTER DELETE ON contacts BEGIN INSERT INTO audit(what) "
    "VALUES (old.email); END",
    "CREATE TABLE _undo_capture_changes (id INTEGER PRIMARY KEY, tbl TEXT, op TEXT, pk TEXT, before TEXT, "
    "after TEXT)",
    "CREATE TRIGGER _undo_capture_contacts_update AFTER UPDATE ON contacts BEGIN INSERT INTO "
    "_undo_capture_changes(tbl, op) VALUES ('contacts', 'U'); END",
    "CREATE VIEW active AS SELECT * FROM contacts WHERE status = 'active'",
]

READS = {
    "both": [
        "SELECT * FROM contacts",
        "SELECT id, email FROM contacts WHERE status = 'active' ORDER BY id LIMIT 10",
        "SELECT count(*) FROM contacts",
        "SELECT c.email, co.name FROM contacts c JOIN companies co ON co.id = c.company_id",
        "SELECT status, count(*) FROM contacts GROUP BY status HAVING count(*) > 1",
        "WITH a AS (SELECT * FROM contacts WHERE status = 'active') SELECT count(*) FROM a",
        "SELECT * FROM contacts WHERE email LIKE '%delete from contacts%'",
        "SELECT 'DROP TABLE contacts; --' AS joke",
        "SELECT lower(email), upper(status), length(email) FROM contacts",
        "SELECT * FROM contacts WHERE id IN (SELECT id FROM contacts WHERE status = 'x')",
        "SELECT 1",
        "SELECT * FROM contacts UNION SELECT * FROM contacts",
        "SELECT max(id), min(id), sum(id), avg(id) FROM contacts",
        "SELECT coalesce(status, 'none') FROM contacts",
        "SELECT * FROM active",
        "VALUES (1), (2)",
        "SELECT \"id\" FROM \"contacts\"",
        "select * from CONTACTS where ID = 1",
    ],
    "postgresql": [
        "EXPLAIN SELECT * FROM contacts",
        "EXPLAIN DELETE FROM contacts",
        "EXPLAIN (FORMAT JSON) UPDATE contacts SET status = 'x'",
        "SHOW search_path",
        "SELECT now(), current_date, date_trunc('day', now())",
        "SELECT $$DROP TABLE contacts$$ AS text",
        "SELECT $tag$ ; DELETE FROM contacts; $tag$",
        "SELECT jsonb_build_object('a', 1)",
        "SELECT string_agg(email, ',') FROM contacts",
        "SELECT * FROM contacts FOR UPDATE",
        "SELECT * FROM generate_series(1, 10)",
        "SELECT row_number() OVER (ORDER BY id) FROM contacts",
        "SELECT E'\\'; DROP TABLE contacts; --'",
        "COMMIT",
        "BEGIN",
        "SELECT pg_sleep(0)",
        "SELECT * FROM public.contacts",
    ],
    "sqlite": [
        "EXPLAIN QUERY PLAN SELECT * FROM contacts",
        "EXPLAIN DELETE FROM contacts",
        "PRAGMA table_info(contacts)",
        "PRAGMA index_list(contacts)",
        "PRAGMA foreign_keys",
        "SELECT * FROM pragma_table_info('contacts')",
        "SELECT random(), abs(-1), typeof(1)",
        "SELECT * FROM sqlite_master",
        "SELECT [id] FROM [contacts]",
        "SELECT `id` FROM `contacts`",
        "SELECT json_object('a', 1)",
        "SELECT group_concat(email) FROM contacts",
        "BEGIN",
        "SELECT * FROM main.contacts",
    ],
}
ROWS = {
    "both": [
        "UPDATE contacts SET status = 'archived' WHERE id < 40",
        "UPDATE contacts SET status = 'x'",
        "DELETE FROM contacts WHERE status = 'spam'",
        "DELETE FROM contacts",
        "INSERT INTO contacts (id, email) VALUES (9001, 'fake@example.com')",
        "INSERT INTO contacts (email) SELECT email FROM contacts WHERE id < 3",
        "INSERT INTO contacts (id, email) VALUES (1, 'a') ON CONFLICT (id) DO UPDATE SET email = "
        "excluded.email",
        "INSERT INTO contacts (id, email) VALUES (1, 'a') ON CONFLICT (id) DO NOTHING",
        "UPDATE contacts SET email = lower(email) WHERE email <> lower(email)",
        "DELETE FROM contacts WHERE id IN (SELECT id FROM contacts WHERE status = 'x')",
        "UPDATE contacts SET status = 'x' WHERE id = 1 RETURNING *",
        "DELETE FROM contacts WHERE id = 3 RETURNING id, email",
        "INSERT INTO companies (name) VALUES ('x') RETURNING id",
        "insert into contacts(email) values ('select')",
        "UPDATE contacts SET email = 'SELECT 1' WHERE id = 2",
    ],
    "postgresql": [
        "WITH d AS (DELETE FROM contacts WHERE id = 1 RETURNING *) SELECT * FROM d",
        "WITH u AS (UPDATE contacts SET status = 'x' RETURNING id) SELECT count(*) FROM u",
        "WITH i AS (INSERT INTO companies (name) VALUES ('x') RETURNING id) SELECT id FROM i",
        "MERGE INTO contacts c USING companies co ON c.company_id = co.id WHEN MATCHED THEN UPDATE SET "
        "status = 'm'",
        "MERGE INTO contacts c USING companies co ON c.id = co.id WHEN MATCHED THEN DELETE",
        "UPDATE contacts c SET status = co.name FROM companies co WHERE co.id = c.company_id",
        "DELETE FROM contacts c USING companies co WHERE co.id = c.company_id AND co.name = 'x'",
        "EXPLAIN ANALYZE DELETE FROM contacts WHERE id = 1",
        "EXPLAIN (ANALYZE) UPDATE contacts SET status = 'x'",
        "EXPLAIN (ANALYZE true, FORMAT JSON) INSERT INTO companies (name) VALUES ('x')",
        "UPDATE public.contacts SET status = 'x' WHERE id = 1",
        "DELETE FROM ONLY contacts WHERE id = 1",
        "WITH moved AS (DELETE FROM contacts WHERE status = 'old' RETURNING *) INSERT INTO companies (name) "
        "SELECT email FROM moved",
    ],
    "sqlite": [
        "WITH doomed AS (SELECT id FROM contacts WHERE status = 'x') DELETE FROM contacts WHERE id IN doomed",
        "WITH n AS (SELECT 1 AS x) INSERT INTO companies (name) SELECT x FROM n",
        "UPDATE contacts SET status = co.name FROM companies co WHERE co.id = contacts.company_id",
        "UPDATE main.contacts SET status = 'x' WHERE id = 1",
        "INSERT INTO contacts DEFAULT VALUES",
        "UPDATE OR IGNORE contacts SET id = 1 WHERE id = 2",
        "INSERT OR IGNORE INTO contacts (id) VALUES (1)",
        "INSERT OR ABORT INTO contacts (id) VALUES (1)",
    ],
}
DESTROYS = {
    "both": [
        "DROP TABLE contacts",
        "DROP TABLE IF EXISTS companies",
        "DROP VIEW active",
        "DROP INDEX IF EXISTS contacts_email",
        "CREATE TABLE t2 (a INTEGER)",
        "CREATE TABLE t3 AS SELECT * FROM contacts",
        "CREATE INDEX contacts_email ON contacts (email)",
        "CREATE VIEW v2 AS SELECT 1 AS x",
        "ALTER TABLE contacts ADD COLUMN phone TEXT",
        "ALTER TABLE contacts RENAME TO people",
        "ALTER TABLE contacts RENAME COLUMN email TO mail",
        "ALTER TABLE contacts DROP COLUMN status",
    ],
    "postgresql": [
        "CREATE TRIGGER t AFTER INSERT ON contacts FOR EACH ROW EXECUTE FUNCTION f()",
        "DROP TABLE contacts CASCADE",
        "DROP TABLE contacts, companies",
        "DROP SCHEMA public CASCADE",
        "DROP DATABASE prod",
        "TRUNCATE contacts",
        "TRUNCATE TABLE contacts, companies RESTART IDENTITY CASCADE",
        "GRANT ALL ON contacts TO public",
        "REVOKE SELECT ON contacts FROM reporting",
        "GRANT admin TO agent",
        "COPY contacts FROM '/tmp/x.csv'",
        "COPY contacts TO '/tmp/x.csv'",
        "COPY (SELECT * FROM contacts) TO STDOUT",
        "DO $$ BEGIN DELETE FROM contacts; END $$",
        "DO $body$ BEGIN EXECUTE 'DROP TABLE contacts'; END $body$ LANGUAGE plpgsql",
        "CALL cleanup_contacts()",
        "SET ROLE admin",
        "SET SESSION AUTHORIZATION admin",
        "RESET ROLE",
        "SET search_path = evil, public",
        "SELECT * INTO backup FROM contacts",
        "CREATE MATERIALIZED VIEW mv AS SELECT * FROM contacts",
        "REFRESH MATERIALIZED VIEW mv",
        "SELECT nextval('contacts_id_seq')",
        "SELECT setval('contacts_id_seq', 1)",
        "SELECT pg_terminate_backend(123)",
        "SELECT lo_import('/etc/passwd')",
        "SELECT dblink_exec('dbname=x', 'DROP TABLE y')",
        "SELECT set_config('search_path', 'evil', false)",
        "SELECT purge_contacts()",
        "SELECT public.archive(id) FROM contacts",
        "SELECT query_to_xml('DELETE FROM contacts RETURNING 1', true, true, '')",
        "UPDATE contacts SET status = archive_one(id)",
        "VACUUM FULL contacts",
        "LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE",
        "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql",
        "ALTER ROLE agent SUPERUSER",
        "CREATE ROLE x LOGIN",
        "PREPARE p AS DELETE FROM contacts",
        "EXECUTE p",
        "NOTIFY channel",
        "CREATE EXTENSION dblink",
        "ALTER SYSTEM SET fsync = off",
        "CLUSTER contacts",
        "REINDEX TABLE contacts",
        "DISCARD ALL",
        "COMMENT ON TABLE contacts IS 'x'",
        "CREATE SCHEMA s2",
        "CREATE SEQUENCE s",
        "LOAD 'evil'",
        "CREATE RULE r AS ON INSERT TO contacts DO INSTEAD NOTHING",
        "ALTER TABLE contacts ENABLE ROW LEVEL SECURITY",
    ],
    "sqlite": [
        "INSERT OR REPLACE INTO contacts (id, email) VALUES (1, 'x')",
        "REPLACE INTO contacts (id, email) VALUES (1, 'x')",
        "UPDATE OR REPLACE contacts SET id = 1 WHERE id = 2",
        "PRAGMA foreign_keys = OFF",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA user_version = 3",
        "SELECT load_extension('/tmp/evil.so')",
        "VACUUM",
        "VACUUM INTO '/tmp/copy.db'",
        "ATTACH DATABASE '/tmp/other.db' AS other",
        "DETACH DATABASE other",
        "ANALYZE",
        "REINDEX",
        "CREATE TEMP TABLE t (a)",
        "CREATE VIRTUAL TABLE v USING fts5(a)",
        "DROP TRIGGER contacts_audit",
        "CREATE TRIGGER t AFTER INSERT ON contacts BEGIN DELETE FROM companies; END",
    ],
}
REFUSED = {
    "postgresql": [
        "SELECT * FROM undo_capture.changes",
        "DELETE FROM undo_capture.changes",
        "UPDATE undo_capture.changes SET before = NULL",
        "DROP SCHEMA undo_capture CASCADE",
        "DROP TABLE undo_capture.changes",
        "TRUNCATE undo_capture.changes",
        "DROP TRIGGER undo_capture ON contacts",
        "DROP TRIGGER undo_capture_rows ON contacts",
        "ALTER TABLE contacts DISABLE TRIGGER ALL",
        "ALTER TABLE contacts DISABLE TRIGGER undo_capture",
        "ALTER TABLE contacts DISABLE TRIGGER USER",
        "ALTER TABLE contacts ENABLE REPLICA TRIGGER undo_capture",
        "ALTER TRIGGER undo_capture ON contacts RENAME TO x",
        "SET session_replication_role = replica",
        "SELECT undo_capture.record()",
        "DROP EVENT TRIGGER undo_capture_guard",
        "ALTER EVENT TRIGGER undo_capture_guard DISABLE",
        "DROP FUNCTION undo_capture.record",
        "GRANT ALL ON undo_capture.changes TO agent",
    ],
    "sqlite": [
        "SELECT * FROM _undo_capture_changes",
        "DELETE FROM _undo_capture_changes",
        "UPDATE _undo_capture_changes SET before = NULL",
        "DROP TABLE _undo_capture_changes",
        "DROP TRIGGER _undo_capture_contacts_update",
        "PRAGMA writable_schema = ON",
        "INSERT INTO _undo_capture_changes (tbl) VALUES ('x')",
        "ALTER TABLE _undo_capture_changes RENAME TO x",
    ],
}
UNKNOWN = {
    "both": ["SELEC * FROM contacts", "DELETE contacts WHERE", "", "   ", "-- only a comment",
             "UPDATE SET x = 1",
             "SELECT * FROM contacts WHERE (", "DROP", "'unterminated"],
    "postgresql": ["SELECT $$ unterminated", "INSERT INTO contacts VALUES (1"],
    "sqlite": ["SELECT * FROM no_such_table", "INSERT INTO contacts (nope) VALUES (1)"],
}

WRAPPERS = [
    "{}",
    "{};",
    "  {}  ",
    "-- a comment\n{}",
    "/* a block comment; with a semicolon */ {}",
    "{} -- trailing comment",
    "\n\n{}\n",
]


def _for(groups: dict, dialect: str) -> list[str]:
    return [*groups.get("both", []), *groups.get(dialect, [])]


def corpus(dialect: str) -> list[tuple[str, str]]:
    """(text, kind) pairs for `dialect` ("postgresql" or "sqlite")."""
    cases: list[tuple[str, str]] = []
    for kind, groups in (("read", READS), ("rows", ROWS), ("destroy", DESTROYS), ("refused", REFUSED)):
        for text, wrapper in itertools.product(_for(groups, dialect), WRAPPERS[:4]):
            cases.append((wrapper.format(text), kind))
        for text, wrapper in zip(_for(groups, dialect), itertools.cycle(WRAPPERS[4:])):
            cases.append((wrapper.format(text), kind))
    cases += [(text, "unknown") for text in _for(UNKNOWN, dialect)]
    # Stacked statements take their worst: a read tool sent a drop after a COMMIT is a drop.
    stacked = [
        ("SELECT 1; COMMIT; DROP TABLE contacts", "destroy"),
        ("SELECT 1; DROP TABLE contacts", "destroy"),
        ("SELECT 1; DELETE FROM contacts WHERE id = 1", "rows"),
        ("SELECT 1; SELECT 2", "read"),
        ("UPDATE contacts SET status = 'x' WHERE id = 1; DROP TABLE companies", "destroy"),
        # One whole transaction, sent in one call as the Recorder asks: its statements, inside whatever the
        # server wraps around the text (issue 58). Control anywhere else lets what follows out of it.
        ("BEGIN; UPDATE contacts SET status = 'x'; COMMIT", "rows"),
        ("BEGIN; SELECT 1; ROLLBACK; DELETE FROM contacts", "destroy"),
        ("BEGIN; UPDATE contacts SET status = 'x'; COMMIT; SELECT 1", "destroy"),
        ("SELECT 1; ROLLBACK; DELETE FROM contacts", "destroy"),
        ("DELETE FROM contacts WHERE id = 1; SELECT 1", "rows"),
        ("SELECT ';'; DROP TABLE contacts", "destroy"),
        ("SELECT 1 /* ; */; DELETE FROM contacts", "rows"),
        ("SELECT '--'; DELETE FROM contacts", "rows"),
        ("SELECT 1;\n-- DROP TABLE contacts\nSELECT 2", "read"),
        ("SELECT 1; /* DROP TABLE contacts; */ SELECT 2", "read"),
        ("UPDATE contacts SET status = 'x'; DELETE FROM contacts WHERE id = 2; INSERT INTO companies (name) "
         "VALUES ('y')", "rows"),
    ]
    if dialect == "postgresql":
        stacked += [("SELECT 1; COMMIT; DROP TABLE undo_capture.changes", "refused"),
                    ("SELECT $$;$$; DROP TABLE contacts", "destroy"),
                    ("SELECT $a$ $$ ; $$ $a$; DELETE FROM contacts", "rows"),
                    ("SELECT 1; SET session_replication_role = replica; DELETE FROM contacts", "refused")]
    else:
        stacked += [("SELECT 1; DROP TRIGGER _undo_capture_contacts_update", "refused"),
                    ("SELECT [;]; DELETE FROM contacts", "unknown"),
                    ("CREATE TABLE t9 (a); INSERT INTO t9 VALUES (1)", "destroy")]
    for (text, kind), wrapper in itertools.product(stacked, WRAPPERS[:3]):
        cases.append((wrapper.format(text), kind))
    # Case changes: the grammar is case-insensitive, the classifier must be too.
    for text, kind in list(cases[:: 7]):
        if kind != "unknown" and "'" not in text and "$" not in text:
            cases.append((text.swapcase() if dialect == "postgresql" else text.upper(), kind))
    return cases
