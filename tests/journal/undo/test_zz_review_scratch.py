"""Scratch review file: DELETE when done."""
import json

import psycopg
import pytest

from approver.models import ActionRequest
from journal.models import Step
from journal.upstream import database
from tests.approver.services.test_held_calls import call, set_policy
from tests.services import needs_node, needs_postgres

from .databases import AGENT_ROLE, pg_rows
from .test_database_truth import dbhub_postgres, on_postgres  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True)]

SETUP = [
    "CREATE FUNCTION mark() RETURNS int LANGUAGE sql VOLATILE AS $$ INSERT INTO notes VALUES ('ran') RETURNING 1 $$",
    "CREATE FUNCTION yell(contacts) RETURNS int LANGUAGE sql AS $$ SELECT mark() $$",
    "CREATE FUNCTION okpos(integer) RETURNS boolean LANGUAGE sql AS $$ SELECT mark() IS NOT NULL $$",
    "CREATE DOMAIN bad_int AS integer CHECK (okpos(VALUE))",
    "CREATE TYPE pair AS (a bad_int)",
    "CREATE FUNCTION imm(integer) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN (SELECT mark()); END $$",
    "ALTER TABLE contacts ADD COLUMN tags text[]",
    "CREATE DOMAIN stamped AS integer DEFAULT mark()",
    "CREATE TABLE arrdom (id integer PRIMARY KEY, n bad_int[])",
    "CREATE TABLE compdom (id integer PRIMARY KEY, p pair)",
    "CREATE TABLE domdef (id integer PRIMARY KEY, s stamped)",
    "CREATE TABLE idx (id integer PRIMARY KEY, v text)",
    "CREATE TABLE kid () INHERITS (companies)",
    "INSERT INTO kid VALUES (500, 'kid row')",
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE TYPE pt AS (x int, y int)",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN email_t AS text",
    "CREATE TABLE plain (id serial PRIMARY KEY, v text DEFAULT 'a', m mood DEFAULT 'sad', p pt, e email_t)",
    "CREATE TABLE withdom (id integer PRIMARY KEY, n posint)",
]
AFTER = ["CREATE INDEX idx_imm ON idx ((imm(id)))"]


def setup(recorder_url, agent_url, extra=()):
    with psycopg.connect(agent_url, autocommit=True) as c:
        for s in SETUP + AFTER + list(extra):
            c.execute(s)
        c.execute("DELETE FROM notes")
    database.install(recorder_url, ["arrdom", "compdom", "domdef", "idx", "plain", "withdom"],
                     agent_roles=[AGENT_ROLE])


def attempt(recorder, token, recorder_url, sql, log):
    before = pg_rows(recorder_url, "SELECT count(*) FROM notes")[0][0]
    result = call(recorder, token, "crm__execute_sql", {"sql": sql})
    after = pg_rows(recorder_url, "SELECT count(*) FROM notes")[0][0]
    text = result.content[0].text if result.content else ""
    held = result.is_error and "approval" in text.lower()
    step = Step.objects.filter(arguments__sql=sql).order_by("-pk").first()
    reading = (step.earlier_state.get("database") or {}).get("reading") if step else None
    kinds = [(s.get("kind"), s.get("verb")) for s in (reading or {}).get("statements", [])]
    reason = ""
    action = ActionRequest.objects.filter(step=step).first() if step else None
    if action:
        reason = action.why.get("reason", "")
    entry = {"sql": sql[:200], "held": held, "error": result.is_error, "text": text[:300],
             "mark_ran": after - before, "kinds": kinds, "reason": reason[:300],
             "reversibility": step.reversibility if step else None,
             "summary": step.effect_summary if step else None,
             "problems": step.undo_problems if step else None}
    log.append(entry)
    print(json.dumps(entry, indent=1, default=str))
    return entry


DEEP = "+".join(["1"] * 250)

ATTACKS = [
    # item 3 bypass attempts (mark() inserts a row into notes, a table no capture sees)
    "MERGE INTO contacts c USING (SELECT 1 AS id) s ON c.id = s.id WHEN MATCHED AND c.yell = 1 THEN UPDATE SET status = 'm1'",
    "MERGE INTO contacts c USING (SELECT 2 AS id) s ON c.id = s.id WHEN MATCHED THEN UPDATE SET status = (3::bad_int)::text",
    "WITH u AS (UPDATE contacts c SET status = 'w' WHERE id = 3 AND c.yell = 1 RETURNING 1) SELECT count(*) FROM u",
    "WITH k AS (SELECT 4 AS id), d AS (DELETE FROM contacts WHERE false RETURNING 1) UPDATE contacts c SET status = 'k' FROM k WHERE c.id = k.id AND c.yell = 1",
    "UPDATE contacts c SET tags[c.yell] = 'x' WHERE id = 5",
    "UPDATE contacts SET status = ('{6}'::bad_int[])::text WHERE id = 6",
    "UPDATE contacts SET status = (ROW(7)::pair)::text WHERE id = 7",
    f"UPDATE contacts c SET status = 'deep' WHERE id = 8 AND c.yell = 1 AND {DEEP} > 0",
    "UPDATE contacts c SET (status, email) = (SELECT name, email) WHERE name = 'Contact 10' AND c.yell = 1",
    "UPDATE contacts c SET (status, email) = (SELECT 's', 'e') FROM (SELECT 11 AS id) AS undo_set0 WHERE c.id = undo_set0.id AND c.yell = 1",
    "WITH d AS (DELETE FROM contacts WHERE false RETURNING id), k AS (SELECT 1 AS one) INSERT INTO contacts (id, name, email, status) SELECT 9001, 'a', 'b', c.yell::text FROM contacts c, k WHERE c.id = 12",
    "INSERT INTO contacts (id, name, email, status, tags[1::bad_int]) VALUES (9002, 'a', 'b', 'c', 'x')",
    "SELECT '{1}'::bad_int[]",
    "SELECT (ROW(1)::pair).a",
    # reach: what a table's writes evaluate besides the text
    "INSERT INTO arrdom VALUES (1, '{5}')",
    "INSERT INTO compdom VALUES (1, ROW(5))",
    "INSERT INTO domdef (id) VALUES (1)",
    "INSERT INTO idx VALUES (1, 'v')",
    "DELETE FROM companies WHERE id = 500",
    "UPDATE companies SET name = 'kid renamed' WHERE id > 100",
]

FINE = [
    "UPDATE contacts SET company_id = DEFAULT WHERE id = 20",
    "INSERT INTO plain DEFAULT VALUES",
    "INSERT INTO plain (v, m, p, e) VALUES ('b', 'happy', ROW(1, 2), 'x@y') RETURNING *",
    "INSERT INTO plain (id, v) VALUES (1, 'c') ON CONFLICT DO NOTHING",
    "INSERT INTO plain (id, v) VALUES (1, 'c') ON CONFLICT (id) DO UPDATE SET v = excluded.v, m = 'happy'::mood RETURNING *",
    "UPDATE plain SET m = 'sad', p = ROW(3, 4)::pt, e = 'z'::email_t WHERE id = 1 RETURNING *",
    "UPDATE plain SET p.x = 9 WHERE id = 1",
    "DELETE FROM plain WHERE id = 2 RETURNING *",
    "INSERT INTO withdom VALUES (1, 5)",
    "UPDATE contacts c SET status = 'ok' FROM companies co WHERE co.id = c.company_id AND c.id = 21 RETURNING c.*",
    "INSERT INTO companies (id, name) VALUES (11, 'a'), (12, 'b')",
    "UPDATE contacts SET tags = ARRAY['a'], status = DEFAULT WHERE id = 22",
    "WITH x AS (SELECT 23 AS id) UPDATE contacts SET status = 'cte' WHERE id IN (SELECT id FROM x)",
    "MERGE INTO contacts c USING (SELECT 24 AS id) s ON c.id = s.id WHEN MATCHED THEN UPDATE SET status = 'merged'",
]


@needs_postgres
@needs_node
def test_attacks(dbhub_postgres, recorder, admin_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 0
    recorder_url, agent_url, token = dbhub_postgres
    setup(recorder_url, agent_url)
    set_policy(admin_user)
    log = []
    for sql in ATTACKS + FINE:
        attempt(recorder, token, recorder_url, sql, log)
    with open("/tmp/review/attacks.json", "w") as f:
        json.dump(log, f, indent=1, default=str)
    print(pg_rows(recorder_url, "SELECT id, status FROM contacts WHERE id <= 12 OR id > 9000 ORDER BY id"))
    print(pg_rows(recorder_url, "SELECT id, name FROM companies WHERE id >= 100"))
