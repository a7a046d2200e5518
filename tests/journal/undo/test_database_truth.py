"""What a database did, from the database (issue 58): every SQL call runs in its database's window, reads
included, and what the capture kept there is the step's truth; texts the server would run otherwise than
they read, transactions left to a later call, and rows SQLite replaces unseen are refused or held before
anything is sent. Against the pinned DBHub (PostgreSQL and SQLite) and mcp-server-sqlite, each outcome
checked in the database's own rows."""

import sqlite3
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.test import Client

from approver import services
from approver.models import ActionRequest
from journal import services as journal_services
from journal.models import Notice, Step, ToolServer
from journal.telemetry import metrics
from journal.upstream import database
from tests.approver.services.test_held_calls import call, decide, held, in_background, set_policy
from tests.services import POSTGRES_URL, needs_node, needs_postgres, needs_sqlite_server

from .databases import AGENT_ROLE, CONTACTS, dbhub_crm, make_crm, pg_rows, postgres_crm, rows, server_command

pytestmark = [pytest.mark.django_db(transaction=True)]

# PostgreSQL reads `a$q$` as a name and what follows `--` as a comment: one SELECT. DBHub's scanner opens a
# dollar quote at `$q$`, closes it inside the comment, and cuts the text at the semicolon after it.
SPLIT_DELETE = "SELECT 1 AS a$q$ -- $q$; DELETE FROM contacts"
SPLIT_DROP = "SELECT 1 AS a$q$ -- $q$; DROP TABLE notes"


@pytest.fixture
def on_postgres():
    with postgres_crm(POSTGRES_URL) as urls:
        yield urls


@pytest.fixture
def dbhub_postgres(on_postgres, admin_user, dana):
    recorder_url, agent_url = on_postgres
    dbhub_crm(recorder_url, agent_url, by=admin_user)
    return recorder_url, agent_url, journal_services.create_agent(name="hostile-bot", on_behalf_of=dana)[1]


@pytest.fixture
def dbhub_sqlite(tmp_path, admin_user, dana):
    path = make_crm(tmp_path / "crm.db")
    database.install(str(path), ["contacts", "companies"])
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="crm", command=server_command("dbhub", str(path)), database=str(path)))
    services.use_pack(server=server, pack="dbhub", by=admin_user)
    return path, journal_services.create_agent(name="hostile-bot", on_behalf_of=dana)[1]


def refused_words(result) -> str:
    assert result.is_error, result.content[0].text
    return result.content[0].text


WHOLE = "send the whole transaction, from its BEGIN to its COMMIT, in one call"


def transactions_refused(recorder, token, *texts: str, words: str = WHOLE):
    for sql in texts:
        assert words in refused_words(call(recorder, token, "crm__execute_sql", {"sql": sql})), sql


def held_saying(recorder, token, texts: dict[str, str]) -> None:
    """Each text, sent through DBHub, held for a person with the words given in its reason."""
    for sql, words in texts.items():
        result = call(recorder, token, "crm__execute_sql", {"sql": sql})
        assert result.is_error and "approval" in result.content[0].text.lower(), sql
        assert words in ActionRequest.objects.get(step=step_of(sql)).why["reason"], sql


def step_of(sql: str) -> Step:
    return Step.objects.get(arguments__sql=sql)


@needs_postgres
@needs_node
def test_a_text_dbhub_cuts_otherwise_than_postgresql_reads_it_is_refused_and_never_sent(
        dbhub_postgres, recorder, admin_user):
    recorder_url, _, token = dbhub_postgres
    set_policy(admin_user, none="allow", unknown="allow")  # whatever the policies say
    for sql in (SPLIT_DELETE, SPLIT_DROP):
        words = refused_words(call(recorder, token, "crm__execute_sql", {"sql": sql}))
        assert "Refused: the server cuts this text into 2 statements where PostgreSQL reads 1 statement" in \
            words and "Nothing was sent to crm" in words
        step = step_of(sql)
        assert (step.policy_decision["decision"], step.policy_decision["capture"]) == ("deny", False)
        assert step.earlier_state["database"]["reading"]["kind"] == "refused"
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS,)]
    assert pg_rows(recorder_url, "SELECT to_regclass('notes') IS NOT NULL") == [(True,)]
    assert pg_rows(recorder_url, "SELECT count(*) FROM undo_capture.changes") == [(0,)]
    # A plain string with a backslash ends where the session's standard_conforming_strings says: refused.
    sly = "SELECT 'a\\' , ' ; COMMIT; TRUNCATE contacts; DROP TABLE notes; -- '"
    for text in (sly, "/* é */ " + sly, "SELECT 'é'; " + sly):  # what comes before moves no offset
        words = refused_words(call(recorder, token, "crm__execute_sql", {"sql": text}))
        assert "Refused: it has a backslash inside a plain quoted string" in words, text
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS,)]
    # The same statements, cut where both read them alike, go through as what they are.
    fine = call(recorder, token, "crm__execute_sql", {"sql": 'SELECT 1 AS "a$q$"; SELECT 2'})
    assert not fine.is_error, fine.content[0].text


@needs_postgres
@needs_node
def test_a_transaction_across_calls_is_refused_on_dbhubs_kept_postgresql_clients(
        dbhub_postgres, recorder, admin_user):
    recorder_url, _, token = dbhub_postgres
    set_policy(admin_user, none="allow", unknown="allow")
    transactions_refused(recorder, token, "BEGIN", "START TRANSACTION", "COMMIT", "SAVEPOINT s",
                         "PREPARE TRANSACTION 'x'", "BEGIN; DELETE FROM contacts WHERE id <= 5")
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS,)]
    # Sent whole, the transaction's rows are the call's.
    whole = "BEGIN; DELETE FROM contacts WHERE id <= 5; COMMIT"
    assert not call(recorder, token, "crm__execute_sql", {"sql": whole}).is_error
    step = step_of(whole)
    assert step.reversibility == "compensate"
    assert step.earlier_state["left"]["database"]["tables"] == {"public.contacts": {"I": 0, "U": 0, "D": 5}}
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS - 5,)]


@needs_node
def test_a_transaction_across_calls_is_refused_on_dbhubs_kept_sqlite_connection(
        dbhub_sqlite, recorder, admin_user):
    path, token = dbhub_sqlite
    set_policy(admin_user, none="allow", unknown="allow")
    # DBHub runs each statement of a text on its own there, and leaves a failed transaction open: no
    # transaction control at all, not even a whole transaction.
    transactions_refused(recorder, token, "BEGIN", "BEGIN IMMEDIATE", "SAVEPOINT s", "COMMIT",
                         "BEGIN; DELETE FROM contacts WHERE id <= 5",
                         "SAVEPOINT a; DELETE FROM contacts WHERE id <= 5",
                         "BEGIN; DELETE FROM contacts WHERE id <= 3; INSERT INTO companies (id, name) "
                         "VALUES (99, NULL); COMMIT", words="send the statements without BEGIN and COMMIT")
    assert rows(path, "SELECT count(*) FROM contacts") == [(CONTACTS,)]
    # A write sent after the refused BEGIN is committed by itself, in its own window.
    write = "DELETE FROM contacts WHERE id <= 7"
    assert not call(recorder, token, "crm__execute_sql", {"sql": write}).is_error
    left = step_of(write).earlier_state["left"]["database"]
    assert left["tables"] == {"contacts": {"I": 0, "U": 0, "D": 7}}
    assert rows(path, "SELECT count(*) FROM contacts") == [(CONTACTS - 7,)]
    kept = rows(path, "SELECT count(*) FROM _undo_capture_changes")
    assert kept == [(7,)]


@needs_node
def test_sqlite_replace_in_any_spelling_through_dbhub_is_held_as_destruction(
        dbhub_sqlite, recorder, admin_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    path, token = dbhub_sqlite
    set_policy(admin_user)
    sql = "INSERT /* no */ OR /* really */ REPLACE INTO contacts (id, name, email, status) " \
          "VALUES (1, 'Fake', 'fake@x.test', 'lead')"
    result = call(recorder, token, "crm__execute_sql", {"sql": sql})
    assert result.is_error and "approval" in result.content[0].text.lower()
    action = ActionRequest.objects.get()
    assert "may replace rows of contacts on a conflict" in action.why["reason"]
    assert rows(path, "SELECT name FROM contacts WHERE id = 1") == [("Contact 1",)]


@needs_sqlite_server
def test_a_table_that_declares_on_conflict_replace_holds_a_plain_insert(tmp_path, recorder, admin_user, dana,
                                                                       settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    path = tmp_path / "crm.db"
    make_crm(path)
    with sqlite3.connect(path) as connection:
        connection.executescript("CREATE TABLE tags (id INTEGER PRIMARY KEY ON CONFLICT REPLACE, label TEXT);"
                                 "INSERT INTO tags VALUES (1, 'vip');")
    server_path = path
    database.install(str(server_path), ["contacts", "tags"])
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="crm", command=server_command("sqlite", str(server_path)), database=str(server_path)))
    services.use_pack(server=server, pack="sqlite", by=admin_user)
    token = journal_services.create_agent(name="hostile-bot", on_behalf_of=dana)[1]
    set_policy(admin_user)
    for sql in ("INSERT INTO tags VALUES (1, 'churned')", "UPDATE tags SET id = 1 WHERE id = 2",
                "INSERT --\nOR REPLACE INTO contacts (id, name, email, status) VALUES (2, 'x', 'x@x', 'x')"):
        result = call(recorder, token, "crm__write_query", {"query": sql})
        assert result.is_error and "approval" in result.content[0].text.lower(), sql
    reasons = [a.why["reason"] for a in ActionRequest.objects.order_by("pk")]
    assert all("on a conflict" in reason for reason in reasons) and len(reasons) == 3
    assert rows(server_path, "SELECT label FROM tags") == [("vip",)]
    assert rows(server_path, "SELECT name FROM contacts WHERE id = 2") == [("Contact 2",)]


def sneaky_functions(agent_url: str) -> None:
    """What a hostile agent that owns its tables can make: a volatile function that deletes, a STABLE one that
    calls it, an overload of a harmless built-in's name, and a view whose definition calls it."""
    with psycopg.connect(agent_url, autocommit=True) as connection:
        connection.execute("CREATE FUNCTION purge() RETURNS int LANGUAGE sql VOLATILE AS "
                           "$$ DELETE FROM contacts WHERE id <= 5 RETURNING 1 $$")
        connection.execute("CREATE FUNCTION tidy() RETURNS int LANGUAGE plpgsql STABLE AS "
                           "$$ BEGIN RETURN (SELECT purge()); END $$")
        connection.execute("CREATE FUNCTION lower(integer) RETURNS int LANGUAGE plpgsql IMMUTABLE AS "
                           "$$ BEGIN RETURN (SELECT purge()); END $$")
        connection.execute("CREATE VIEW tidy_contacts AS SELECT id, purge() AS gone FROM contacts")
        connection.execute("CREATE VIEW nice AS SELECT * FROM tidy_contacts")
        # Calls that name no function the way a reader of the text would see: a name only quotes make, an
        # operator, column notation, a domain whose check runs a function.
        connection.execute('CREATE FUNCTION "pg_catalog.abs"(integer) RETURNS int LANGUAGE sql AS '
                           "$$ SELECT purge() $$")
        connection.execute('CREATE FUNCTION "COUNT"(integer) RETURNS int LANGUAGE sql AS '
                           "$$ SELECT purge() $$")
        connection.execute("CREATE FUNCTION purge_op(integer, integer) RETURNS int LANGUAGE sql AS "
                           "$$ SELECT purge() $$")
        connection.execute("CREATE OPERATOR ### (LEFTARG = integer, RIGHTARG = integer, FUNCTION = purge_op)")
        connection.execute("CREATE FUNCTION shout(contacts) RETURNS int LANGUAGE sql AS $$ SELECT purge() $$")
        connection.execute("CREATE FUNCTION positive(integer) RETURNS boolean LANGUAGE sql AS "
                           "$$ SELECT purge() IS NOT NULL $$")
        connection.execute("CREATE DOMAIN evil_int AS integer CHECK (positive(VALUE))")
        # A row security policy that calls it, and a function the agent added to an extension it made.
        connection.execute("CREATE TABLE vault (id integer PRIMARY KEY, v text)")
        connection.execute("INSERT INTO vault VALUES (1, 'a')")
        connection.execute("ALTER TABLE vault ENABLE ROW LEVEL SECURITY")
        connection.execute("ALTER TABLE vault FORCE ROW LEVEL SECURITY")
        connection.execute("CREATE POLICY sly ON vault USING (positive(id))")
        connection.execute("CREATE EXTENSION IF NOT EXISTS pgcrypto")
        connection.execute("CREATE FUNCTION calm() RETURNS int LANGUAGE sql STABLE AS $$ SELECT 1 $$")
        connection.execute("ALTER EXTENSION pgcrypto ADD FUNCTION calm()")


@needs_postgres
@needs_node
def test_postgresql_functions_and_views_are_judged_by_what_they_are_not_by_their_names(
        dbhub_postgres, recorder, admin_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    recorder_url, agent_url, token = dbhub_postgres
    sneaky_functions(agent_url)
    set_policy(admin_user)
    held = {"SELECT tidy()": "calling tidy()", "SELECT lower(7)": "calling lower()",
            "SELECT * FROM tidy_contacts": "through view tidy_contacts, whose definition calls purge()",
            "SELECT count(*) FROM nice": "through view nice, whose definition reads view tidy_contacts",
            'SELECT "pg_catalog.abs"(1)': 'calling "pg_catalog.abs"()',
            'SELECT "COUNT"(1)': 'calling "COUNT"()',
            "SELECT 1 ### 2": "calling operator ###", "SELECT c.shout FROM contacts c WHERE id = 1":
            "using shout()", "SELECT 5::evil_int": "using domain evil_int",
            "SELECT 1; SELECT 5::evil_int": "using domain evil_int",
            "EXPLAIN ANALYZE SELECT c.shout FROM contacts c WHERE id = 1": "using shout()",
            "SELECT * FROM vault": "through table vault, whose row security policy sly calls "
                                   "public.positive()",
            "UPDATE vault SET v = 'q' WHERE id = 1": "whose row security policy sly calls public.positive()",
            "SELECT calm()": "calling calm()"}
    for sql, words in held.items():
        result = call(recorder, token, "crm__execute_sql", {"sql": sql})
        assert result.is_error and "approval" in result.content[0].text.lower(), sql
        reading = step_of(sql).earlier_state["database"]["reading"]
        verbs = " / ".join(statement["verb"] for statement in reading["statements"])
        assert reading["kind"] == "destroy" and words in verbs, reading
    # Built-ins go by the catalogue: lower() of a text, now(), a read of a plain table.
    for sql in ("SELECT lower(name), now() FROM contacts WHERE id = 1", "SELECT count(*) FROM contacts",
                "SELECT 1 + 2, abs(-1), count(*) FROM contacts WHERE name LIKE 'C%' AND id BETWEEN 1 AND 9"):
        assert not call(recorder, token, "crm__execute_sql", {"sql": sql}).is_error
        assert step_of(sql).reversibility == "read_only"
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS,)]


@needs_postgres
@needs_node
def test_what_a_row_change_evaluates_is_resolved_by_postgresql_as_a_reads_is(dbhub_postgres, recorder,
                                                                             admin_user, settings):
    """A write calls a function as a read can, where no reader of the text sees a call: by column notation,
    through a cast to a domain whose check calls one, in its RETURNING, in ON CONFLICT's update. What each
    row change evaluates is resolved by PostgreSQL (a view of it, made and rolled back) and held, never
    sent; plain writes stay undoable."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    recorder_url, agent_url, token = dbhub_postgres
    sneaky_functions(agent_url)
    set_policy(admin_user)
    held_saying(recorder, token, {
        "UPDATE contacts c SET status = 'x' WHERE c.shout = 1": "uses shout()",
        "UPDATE contacts c SET status = c.shout::text WHERE id = 1": "uses shout()",
        "UPDATE contacts SET status = 'x' WHERE id = 3::evil_int": "uses domain evil_int",
        "UPDATE contacts c SET (status, name) = (SELECT c.shout::text, 'n') WHERE id = 1": "uses shout()",
        "DELETE FROM contacts c WHERE id = 2 RETURNING c.shout": "uses shout()",
        "INSERT INTO contacts (id, name, email, status) SELECT c.id + 1000, c.name, c.email, c.shout::text "
        "FROM contacts c WHERE id = 1": "uses shout()",
        "INSERT INTO contacts (id, name, email, status) VALUES (1, 'a', 'a@x', 'new') ON CONFLICT (id) DO "
        "UPDATE SET status = excluded.shout::text": "uses shout()",
        "INSERT INTO contacts (id, name, email, status) VALUES (5000, 'a', 'a@x', 7::evil_int::text)":
            "uses domain evil_int",
        # A row change PostgreSQL will not make a view of (its FROM names a WITH that writes) beside one it
        # will: each is then resolved alone.
        "WITH g AS (DELETE FROM notes RETURNING *) INSERT INTO notes SELECT * FROM g; "
        "UPDATE contacts c SET status = 'x' WHERE c.shout = 1": "uses shout()"})
    assert pg_rows(recorder_url, "SELECT count(*), count(*) FILTER (WHERE status = 'x') FROM contacts") == [
        (CONTACTS, 0)]
    plain = "UPDATE contacts SET status = 'fine' WHERE id = 1 RETURNING id, lower(name)"
    assert not call(recorder, token, "crm__execute_sql", {"sql": plain}).is_error
    assert (step_of(plain).reversibility, step_of(plain).effect_summary) == (
        "compensate", "Updated 1 row of public.contacts.")


@needs_postgres
@needs_node
def test_what_postgresql_cannot_be_asked_about_is_held_and_every_form_of_a_write_is_asked(
        dbhub_postgres, recorder, admin_user, settings):
    """The second review's bypasses: MERGE, a SELECT whose WITH writes, subscripts of the column set, a cast
    to an array of a domain, a WITH of plain and writing parts, a name clash with the Recorder's own, a
    long VALUES list, and a text too deep to print: each held, never sent. A domain whose check uses only
    built-ins changes nothing, and a parent table's UPDATE or DELETE reaches the tables that inherit it."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    recorder_url, agent_url, token = dbhub_postgres
    sneaky_functions(agent_url)
    with psycopg.connect(agent_url, autocommit=True) as connection:
        connection.execute("ALTER TABLE contacts ADD COLUMN tags text[]")
        connection.execute("CREATE DOMAIN email_t AS text CHECK (VALUE LIKE '%@%')")
        connection.execute("CREATE TABLE kid () INHERITS (companies)")
        connection.execute("INSERT INTO kid VALUES (500, 'Kid')")
    set_policy(admin_user)
    many = ", ".join(f"({n}, 'n', 'e@x', 'new')" for n in range(6000, 6420))
    held_saying(recorder, token, {
        "MERGE INTO contacts c USING (SELECT 1 AS id) s ON c.id = s.id WHEN MATCHED AND c.shout = 1 THEN "
        "UPDATE SET status = 'm1'": "uses shout()",
        "WITH u AS (UPDATE contacts c SET status = 'w' WHERE id = 3 AND c.shout = 1 RETURNING 1) "
        "SELECT count(*) FROM u": "uses shout()",
        "UPDATE contacts c SET tags[c.shout] = 'x' WHERE id = 5": "uses shout()",
        "UPDATE contacts SET status = ('{6}'::evil_int[])::text WHERE id = 6": "uses domain evil_int",
        "SELECT '{1}'::evil_int[]": "uses domain evil_int",
        "WITH k AS (SELECT 4 AS id), d AS (DELETE FROM notes WHERE false RETURNING 1) "
        "UPDATE contacts c SET status = 'k' FROM k WHERE c.id = k.id AND c.shout = 1": "using shout()",
        "UPDATE contacts c SET (status, email) = (SELECT 's', 'e') FROM (SELECT 11 AS id) AS "
        "undo_capture_set_0 WHERE c.id = undo_capture_set_0.id AND c.shout = 1":
            "PostgreSQL could not be asked",
        "UPDATE contacts c SET (status, email) = (SELECT name, email) WHERE name = 'Contact 10' "
        "AND c.shout = 1": "uses shout()",
        f"INSERT INTO contacts (id, name, email, status) VALUES (5999, 'n', 'e@x', "
        f"(SELECT c.shout::text FROM contacts c WHERE id = 1)), {many}": "uses shout()",
        "UPDATE contacts c SET status = 'deep' WHERE id = 8 AND " + " + ".join(["1"] * 300) + " > 0":
            "PostgreSQL could not be asked",
        "DELETE FROM companies WHERE id = 500": "also changes rows of public.kid (it inherits from "
                                                "public.companies)"})
    assert pg_rows(recorder_url, "SELECT count(*), count(*) FILTER (WHERE status <> 'active' AND status <> "
                   "'lead') FROM contacts") == [(CONTACTS, 0)]
    assert pg_rows(recorder_url, "SELECT count(*) FROM kid") == [(1,)]
    for sql in ("SELECT 'a@b'::email_t", "UPDATE contacts SET email = 'z@x'::email_t WHERE id = 1"):
        assert not call(recorder, token, "crm__execute_sql", {"sql": sql}).is_error, sql
        assert step_of(sql).reversibility in ("read_only", "compensate"), sql


@needs_postgres
@needs_node
def test_a_call_read_as_a_read_that_changed_rows_is_recorded_as_the_rows_say_and_flagged(
        dbhub_postgres, recorder, admin_user):
    """An admin vouched for a function that lies: the statements read as a read; the capture kept the rows
    its volatile helper deleted; the step is what the rows say, undoable, and says it was misread."""
    recorder_url, agent_url, token = dbhub_postgres
    sneaky_functions(agent_url)
    server = ToolServer.objects.get(name="crm")
    recipe = {**server.recipe("execute_sql"), "safeFunctions": ["tidy"]}
    services.save_recipe(server=server, raw=recipe, by=admin_user)
    set_policy(admin_user)
    before = metrics.ROWS_MISREAD.labels(server="crm")._value.get()
    sql = "SELECT tidy()"
    assert not call(recorder, token, "crm__execute_sql", {"sql": sql}).is_error
    step = step_of(sql)
    assert step.earlier_state["database"]["reading"]["kind"] == "read"
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS - 5,)]
    left = step.earlier_state["left"]["database"]
    assert left["tables"] == {"public.contacts": {"I": 0, "U": 0, "D": 5}}
    assert left["misread"] == "read as a read, but the database says it deleted 5 rows of public.contacts"
    assert (step.reversibility, step.declaration["compensation"]["dialect"]) == ("compensate", "database")
    assert step.effect_summary == ("Deleted 5 rows of public.contacts, though its statements read as a "
                                   "read.")
    assert metrics.ROWS_MISREAD.labels(server="crm")._value.get() == before + 5
    entry = next(e for e in step.run.entries.order_by("seq") if e.event == "result")
    assert entry.data["readAfter"]["database"]["misread"] == left["misread"]
    assert journal_services.verify_run(run=step.run).ok


def cascading(connection_execute) -> None:
    """Orders that go with their company (ON DELETE CASCADE), and an audit a trigger on contacts writes."""
    for sql in ("CREATE TABLE orders (id integer PRIMARY KEY, company_id integer REFERENCES companies (id) "
                "ON DELETE CASCADE)",
                "INSERT INTO companies (id, name) VALUES (11, 'Company 11')",
                "INSERT INTO orders (id, company_id) VALUES (1, 11), (2, 11), (3, 2)"):
        connection_execute(sql)


@needs_postgres
@needs_node
def test_what_a_statement_reaches_beyond_its_tables_on_postgresql_is_followed(
        dbhub_postgres, recorder, admin_user, settings, capsys):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    recorder_url, agent_url, token = dbhub_postgres
    with psycopg.connect(agent_url, autocommit=True) as connection:
        cascading(connection.execute)
        connection.execute("CREATE TABLE audit (id serial PRIMARY KEY, what text)")
        connection.execute("CREATE FUNCTION keep_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                           "INSERT INTO audit (what) VALUES (OLD.email); RETURN OLD; END $$")
        connection.execute("CREATE TRIGGER audited AFTER DELETE ON contacts FOR EACH ROW "
                           "EXECUTE FUNCTION keep_audit()")
        connection.execute("CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                           "NEW.name := trim(NEW.name); RETURN NEW; END $$")
        connection.execute("CREATE TRIGGER stamped BEFORE UPDATE ON contacts FOR EACH ROW "
                           "EXECUTE FUNCTION stamp()")
    set_policy(admin_user)
    held = {"DELETE FROM companies WHERE id = 11": "Deleting companies also deletes rows of public.orders "
                                                  "(ON DELETE CASCADE), which the capture does not keep",
            "DELETE FROM contacts WHERE id = 1": "Deleting contacts also writes public.audit (its trigger "
                                                 "audited), which the capture does not keep"}
    for sql, words in held.items():
        result = call(recorder, token, "crm__execute_sql", {"sql": sql})
        assert result.is_error and "approval" in result.content[0].text.lower(), sql
        assert words in ActionRequest.objects.get(step=step_of(sql)).why["reason"]
    assert pg_rows(recorder_url, "SELECT count(*) FROM orders") == [(3,)]
    # A trigger that only shapes the row it fires for reaches nothing else: the update goes through.
    update = "UPDATE contacts SET name = ' Ada ' WHERE id = 2"
    assert not call(recorder, token, "crm__execute_sql", {"sql": update}).is_error
    assert step_of(update).reversibility == "compensate"
    # A trigger calling what only the catalogue can tell from a built-in, and a default calling a user's
    # function, reach as far as what they call.
    with psycopg.connect(agent_url, autocommit=True) as connection:
        connection.execute("CREATE FUNCTION lower(integer) RETURNS int LANGUAGE sql AS "
                           "$$ DELETE FROM notes RETURNING 1 $$")
        connection.execute("CREATE FUNCTION sly() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                           "PERFORM lower(1); RETURN NEW; END $$")
        connection.execute("CREATE TRIGGER sly AFTER UPDATE OF email ON contacts FOR EACH ROW "
                           "EXECUTE FUNCTION sly()")
        connection.execute("CREATE FUNCTION next_name() RETURNS text LANGUAGE sql AS "
                           "$$ DELETE FROM notes RETURNING 'x' $$")
        connection.execute("ALTER TABLE companies ALTER COLUMN name SET DEFAULT next_name()")
    held_saying(recorder, token, {
        "UPDATE contacts SET email = 'e' WHERE id = 3":
            "trigger sly on public.contacts calls lower(), which the Recorder does not follow",
        "INSERT INTO companies (id) VALUES (50)":
            "a column default of public.companies uses public.next_name(), which may change"})
    # And the capture's own command names what to add.
    call_command("capture", "crm")
    out = capsys.readouterr().out
    assert "public.companies: changing its rows also changes public.orders (ON DELETE CASCADE)" in out
    assert "public.contacts: changing its rows also changes public.audit (its trigger audited)" in out
    database.install(recorder_url, ["orders", "audit"])
    gone = "DELETE FROM companies WHERE id = 11;"
    assert not call(recorder, token, "crm__execute_sql", {"sql": gone}).is_error
    cascade = step_of(gone)
    assert cascade.reversibility == "compensate"
    assert cascade.earlier_state["left"]["database"]["tables"] == {
        "public.companies": {"I": 0, "U": 0, "D": 1}, "public.orders": {"I": 0, "U": 0, "D": 2}}


@needs_node
def test_a_foreign_keys_cascade_on_sqlite_into_a_table_not_captured_is_held(
        dbhub_sqlite, recorder, admin_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    path, token = dbhub_sqlite
    with sqlite3.connect(path) as connection:
        cascading(connection.execute)
    set_policy(admin_user)
    sql = "DELETE FROM companies WHERE id = 11"
    result = call(recorder, token, "crm__execute_sql", {"sql": sql})
    assert result.is_error and "approval" in result.content[0].text.lower()
    assert "orders is not captured" in ActionRequest.objects.get().why["reason"]
    assert rows(path, "SELECT count(*) FROM orders") == [(3,)]


@needs_postgres
@needs_node
def test_the_captures_own_settings_are_refused_never_held(dbhub_postgres, recorder, admin_user):
    recorder_url, _, token = dbhub_postgres
    set_policy(admin_user, none="allow", unknown="allow")
    for sql in ("SET undo_capture.restoring = 'on'", "SET LOCAL undo_capture.restoring TO on",
                "SELECT set_config('undo_capture.restoring', 'on', false)",
                "SELECT set_config(name, 'on', false) FROM contacts",
                "ALTER ROLE undo_agent SET undo_capture.restoring = 'on'"):
        words = refused_words(call(recorder, token, "crm__execute_sql", {"sql": sql}))
        assert "Refused: it touches" in words and "capture" in words, sql
        assert step_of(sql).policy_decision["capture"] is True
    assert ActionRequest.objects.count() == 0
    assert pg_rows(recorder_url, "SELECT count(*) FROM pg_db_role_setting") == [(0,)]


@needs_sqlite_server
def test_a_trigger_whose_body_writes_the_capture_is_refused(tmp_path, recorder, admin_user, dana):
    path = tmp_path / "crm.db"
    server = sqlite_crm_server(path, admin_user)
    token = journal_services.create_agent(name="hostile-bot", on_behalf_of=dana)[1]
    set_policy(admin_user, none="allow", unknown="allow")
    for sql in ("CREATE TRIGGER tidy AFTER INSERT ON contacts BEGIN DELETE FROM _undo_capture_changes; END",
                "CREATE TRIGGER tidy AFTER UPDATE ON companies BEGIN "
                "UPDATE _undo_capture_tables SET key = ''; END"):
        words = refused_words(call(recorder, token, "crm__write_query", {"query": sql}))
        assert "Refused: it creates a trigger that touches _undo_capture" in words, sql
    assert rows(path, "SELECT count(*) FROM sqlite_master WHERE name = 'tidy'") == [(0,)]
    assert server.name == "crm"


@needs_sqlite_server
def test_a_whole_table_delete_in_any_spelling_is_counted_and_kept_first(tmp_path, recorder, admin_user, dana,
                                                                        approver_user, settings):
    path, token = sqlite_agent(tmp_path, admin_user, dana, settings)
    sql = "DELETE FROM companies WHERE 1 = 1 -- AND id = 3"
    reason = approved_call(recorder, token, approver_user, sql)
    assert "It deletes every row of companies (10 rows)" in reason
    assert rows(path, "SELECT count(*) FROM companies") == [(0,)]
    step = Step.objects.filter(arguments__query=sql).latest("number")
    assert step.effect_summary == "Emptied companies (10 rows): kept beforehand, so it can be undone."


@needs_postgres
def test_the_capture_can_be_put_in_place_again_under_its_guard(on_postgres, capsys):
    recorder_url, agent_url = on_postgres
    journal_services.register_tool_server(name="crm", command="true", database=recorder_url)
    call_command("capture", "crm", tables="contacts")
    guards = "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'undo_capture%%'"
    assert pg_rows(recorder_url, guards) == [(2,)]
    call_command("capture", "crm", tables="contacts,companies")  # again, under the guard: fine
    assert pg_rows(recorder_url, "SELECT count(*) FROM pg_trigger WHERE tgname = 'undo_capture'") == [(2,)]
    with psycopg.connect(agent_url, autocommit=True) as connection, pytest.raises(psycopg.Error):
        connection.execute("DROP TRIGGER undo_capture ON contacts")  # and still refused to anyone else


def sqlite_agent(tmp_path, admin_user, dana, settings):
    """The CRM on mcp-server-sqlite, cleanup-bot's token, the default policies, and a held call's wait."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    path = tmp_path / "crm.db"
    sqlite_crm_server(path, admin_user)
    set_policy(admin_user)
    return path, journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]


def approved_call(recorder, token, approver_user, sql: str) -> str:
    """An agent's write_query, held, approved and sent: why it was held."""
    thread, box = in_background(lambda: call(recorder, token, "crm__write_query", {"query": sql}))
    action = held()
    decide(action, approver_user, "approve")
    thread.join(timeout=60)
    assert not box["result"].is_error, box["result"].content[0].text
    return action.why["reason"]


def sqlite_crm_server(path, admin_user):
    make_crm(path)
    database.install(str(path), ["contacts"])
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="crm", command=server_command("sqlite", str(path)), database=str(path)))
    services.use_pack(server=server, pack="sqlite", by=admin_user)
    return server


@needs_sqlite_server
def test_the_same_text_sent_again_is_read_again_not_taken_from_a_cache(tmp_path, recorder, admin_user, dana):
    """SQLite does not compile a statement it has cached, so its authorizer would hear nothing the second
    time a text is read: a refused read of the capture would pass as a read."""
    path = tmp_path / "crm.db"
    sqlite_crm_server(path, admin_user)
    token = journal_services.create_agent(name="hostile-bot", on_behalf_of=dana)[1]
    set_policy(admin_user, none="allow", unknown="allow")
    call(recorder, token, "crm__write_query", {"query": "UPDATE contacts SET status = 'x' WHERE id = 1"})
    for _ in range(3):
        words = refused_words(call(recorder, token, "crm__read_query",
                                   {"query": "SELECT * FROM _undo_capture_changes"}))
        assert "Refused: it touches _undo_capture_changes" in words
    for _ in range(2):
        assert not call(recorder, token, "crm__write_query",
                        {"query": "UPDATE contacts SET status = 'y' WHERE id = 2"}).is_error
    steps = Step.objects.filter(arguments__query="UPDATE contacts SET status = 'y' WHERE id = 2")
    assert [s.reversibility for s in steps] == ["compensate", "compensate"]


@needs_sqlite_server
def test_a_row_sqlite_replaced_unseen_makes_the_steps_undo_unknown_not_a_delete_of_the_new_row(
        tmp_path, recorder, admin_user, dana, approver_user, settings):
    """The net under the reading: an approved REPLACE (or one the reading missed) replaced a row whose key
    existed; the capture's marker says so, and the step's undo is unknown rather than "delete the new row"."""
    path, token = sqlite_agent(tmp_path, admin_user, dana, settings)
    sql = "INSERT OR REPLACE INTO contacts (id, name, email, status) VALUES (1, 'Fake', 'f@x.test', 'lead')"
    assert "may replace rows of contacts" in approved_call(recorder, token, approver_user, sql)
    assert rows(path, "SELECT name FROM contacts WHERE id = 1") == [("Fake",)]
    step = Step.objects.filter(arguments__query=sql).latest("number")
    assert step.reversibility == "unknown"
    assert "it replaced rows whose keys it wrote again (1 row of contacts)" in step.undo_problems[0]
    # An upsert and an ignored insert leave markers that say nothing: their steps are what their rows say.
    for fine in ("INSERT INTO contacts (id, name, email, status) VALUES (2, 'x', 'x@x', 'lead') "
                 "ON CONFLICT (id) DO UPDATE SET status = 'vip'",
                 "INSERT OR IGNORE INTO contacts (id, name, email, status) VALUES (3, 'y', 'y@x', 'lead')"):
        assert not call(recorder, token, "crm__write_query", {"query": fine}).is_error
    upsert, ignored = (Step.objects.filter(arguments__query__startswith=f"INSERT {w}").get()
                       for w in ("INTO contacts (id, name, email, status) VALUES (2", "OR IGNORE"))
    assert (upsert.reversibility, upsert.effect_summary) == ("compensate", "Updated 1 row of contacts.")
    assert (ignored.reversibility, ignored.effect_summary) == ("read_only", "It changed no rows.")


@needs_postgres
def test_rows_no_recorded_call_made_are_found_shown_and_never_pruned_unseen(on_postgres, admin_user,
                                                                            settings):
    """The net: rows an agent's role changed outside every window (here, with its credentials, around the
    Recorder) are found by the sweep before the prune may forget them, and shown on the server's page."""
    settings.RECORDER_CAPTURE_SWEEP_LAG_SECONDS = 0
    recorder_url, agent_url = on_postgres
    server = journal_services.register_tool_server(name="crm", command="true", database=recorder_url)
    database.install(recorder_url, ["contacts"], agent_roles=[AGENT_ROLE])
    with psycopg.connect(recorder_url, autocommit=True) as connection:  # another writer: not the agents'
        connection.execute("UPDATE contacts SET status = 'by-dba' WHERE id = 9")
    with psycopg.connect(agent_url, autocommit=True) as connection:
        connection.execute("DELETE FROM contacts WHERE id IN (1, 2, 3)")
    before = metrics.ROWS_UNRECORDED.labels(server="crm")._value.get()
    # A change id is taken when a row is written and may be committed much later: the first sweep notes how
    # far ids go and which transactions run; the next goes that far once they have all ended.
    journal_services.sweep_capture(server=server)
    server.refresh_from_db()
    assert (server.capture_swept_to, server.unrecorded) == (0, [])
    assert journal_services.prune_capture(server=server) == 0
    server.refresh_from_db()
    assert len(server.unrecorded) == 1
    finding = server.unrecorded[0]
    assert (finding["rows"], finding["tables"], finding["roles"]) == (3, {"public.contacts": 3}, [AGENT_ROLE])
    assert metrics.ROWS_UNRECORDED.labels(server="crm")._value.get() == before + 3
    assert pg_rows(recorder_url, "SELECT count(*) FROM undo_capture.changes") == [(4,)]
    web = Client()
    web.force_login(admin_user)
    page = web.get(f"/servers/{server.pk}/").content.decode()
    assert "Changed by no recorded call" in page and "3 rows of public.contacts" in page
    journal_services.sweep_capture(server=server)  # swept: not found again
    server.refresh_from_db()
    assert len(server.unrecorded) == 1 and server.capture_swept_to == 4
    # A transaction that took its ids before a sweep and commits after it is found all the same.
    with psycopg.connect(agent_url) as late:
        late.execute("DELETE FROM contacts WHERE id IN (20, 21)")  # ids 5 and 6, not committed yet
        with psycopg.connect(recorder_url, autocommit=True) as connection:
            connection.execute("UPDATE contacts SET status = 'by-dba' WHERE id = 30")  # id 7, committed
        journal_services.sweep_capture(server=server)
        journal_services.sweep_capture(server=server)
        server.refresh_from_db()
        assert server.capture_swept_to == 4  # not past ids a running transaction may hold
    journal_services.sweep_capture(server=server)  # committed: the horizon is reached
    server.refresh_from_db()
    last = server.unrecorded[-1]
    assert (last["rows"], last["from"], last["to"]) == (2, 5, 6)
    out = StringIO()
    call_command("capture", "crm", stdout=out)
    assert "Changed by no recorded call: 3 rows of public.contacts, between" in out.getvalue()


@needs_sqlite_server
def test_on_sqlite_a_calls_rows_are_in_its_window_and_others_are_changed_by_no_recorded_call(
        tmp_path, recorder, admin_user, dana, settings):
    settings.RECORDER_CAPTURE_SWEEP_LAG_SECONDS = 0
    path = tmp_path / "crm.db"
    server = sqlite_crm_server(path, admin_user)
    token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
    set_policy(admin_user)
    assert not call(recorder, token, "crm__write_query",
                    {"query": "UPDATE contacts SET status = 'x' WHERE id <= 4"}).is_error
    with sqlite3.connect(path) as connection:  # around the Recorder
        connection.execute("UPDATE contacts SET status = 'y' WHERE id BETWEEN 10 AND 11")
    journal_services.sweep_capture(server=server)
    server.refresh_from_db()
    assert [(f["rows"], f["tables"], f["from"], f["to"]) for f in server.unrecorded] == [
        (2, {"contacts": 2}, 5, 6)]


@pytest.fixture
def quick_timeout(settings):
    settings.TOOL_SERVER_TIMEOUT = 2  # read when the Recorder starts


@needs_postgres
@needs_node
def test_a_call_that_times_out_keeps_its_window_until_its_statement_ends(
        quick_timeout, dbhub_postgres, recorder, admin_user, dana):
    """The agent hears the timeout once the database has finished the statement, and its rows are its own
    step's: not rows of no call, and never a later call's."""
    recorder_url, _, token = dbhub_postgres
    set_policy(admin_user)
    slow = "DELETE FROM contacts WHERE id <= 5 AND (SELECT count(*) FROM (SELECT pg_sleep(4)) s) = 1"
    assert call(recorder, token, "crm__execute_sql", {"sql": slow}).is_error
    other = journal_services.create_agent(name="other-bot", on_behalf_of=dana)[1]
    read = "SELECT count(*) FROM contacts"
    assert not call(recorder, other, "crm__execute_sql", {"sql": read}).is_error
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS - 5,)]
    timed_out = step_of(slow)
    assert timed_out.may_have_acted
    deleted = {"public.contacts": {"I": 0, "U": 0, "D": 5}}
    assert timed_out.earlier_state["left"]["database"]["tables"] == deleted
    assert (step_of(read).reversibility, step_of(read).effect_summary) == ("read_only", "It changed no rows.")


@needs_postgres
@needs_node
def test_names_are_read_on_the_agents_search_path_not_the_recorders(dbhub_postgres, recorder, admin_user,
                                                                     settings):
    """The agent's role has a schema of its own, first on its path ("$user"): its contacts (not captured)
    and a view calling a writing function there are what its server reaches, and what the reading reads."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 0
    recorder_url, agent_url, token = dbhub_postgres
    sneaky_functions(agent_url)
    with psycopg.connect(agent_url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {AGENT_ROLE}")
        connection.execute(f"CREATE TABLE {AGENT_ROLE}.contacts (id integer PRIMARY KEY, name text)")
        connection.execute(f"INSERT INTO {AGENT_ROLE}.contacts VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        connection.execute(f"CREATE VIEW {AGENT_ROLE}.companies AS SELECT 1 AS id, purge() AS gone")
    set_policy(admin_user)
    for sql in ("DELETE FROM contacts WHERE id <= 3", "SELECT * FROM companies WHERE id = 1"):
        result = call(recorder, token, "crm__execute_sql", {"sql": sql})
        assert result.is_error and "approval" in result.content[0].text.lower(), sql
    assert pg_rows(recorder_url, f"SELECT count(*) FROM {AGENT_ROLE}.contacts") == [(3,)]
    assert pg_rows(recorder_url, "SELECT count(*) FROM public.contacts") == [(CONTACTS,)]
    reasons = [a.why["reason"] for a in ActionRequest.objects.order_by("pk")]
    assert "contacts is not captured" in reasons[0] and "purge()" in reasons[1], reasons


@needs_postgres
@needs_node
def test_what_a_tables_conditions_checks_and_domains_call_is_followed(dbhub_postgres, recorder, admin_user,
                                                                     settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 0
    recorder_url, agent_url, token = dbhub_postgres
    sneaky_functions(agent_url)
    with psycopg.connect(agent_url, autocommit=True) as connection:
        connection.execute("CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                           "RETURN NEW; END $$")
        connection.execute("CREATE TRIGGER whenever BEFORE UPDATE ON companies FOR EACH ROW "
                           "WHEN (positive(NEW.id)) EXECUTE FUNCTION stamp()")
        connection.execute("ALTER TABLE contacts ADD CONSTRAINT sly CHECK (id ### 1 = 1 OR true) NOT VALID")
        connection.execute("CREATE TABLE tagged (id integer PRIMARY KEY, n evil_int)")
    database.install(recorder_url, ["tagged"], agent_roles=[AGENT_ROLE])
    set_policy(admin_user)
    held_saying(recorder, token, {
        "UPDATE companies SET name = 'x' WHERE id = 2":
            "the condition of trigger whenever of public.companies uses public.positive()",
        "UPDATE contacts SET status = 'x' WHERE id = 2": "a check of public.contacts uses operator ###",
        "INSERT INTO tagged (id) VALUES (1)": "a column of domain evil_int of public.tagged"})
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS,)]


def run_text(url: str, text: str) -> None:
    """A text of several statements, sent whole (the simple query protocol: one implicit transaction)."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(text)


@needs_postgres
@needs_node
def test_what_a_call_that_gave_up_commits_later_is_its_steps_and_no_one_elses(
        quick_timeout, dbhub_postgres, recorder, admin_user, dana, settings):
    """A call whose statement outlives its window (it timed out, and was still running when the settle wait
    ran out): what its own transaction commits later is attached to its step, proven by the transaction id
    (its run's record says so; the server's findings do not count it). Another session of the agents' roles
    running then proves nothing: its rows are changed by no recorded call, probably that call's. The
    finding goes to the audit stream as a notice of its own."""
    settings.RECORDER_DATABASE_SETTLE_SECONDS, settings.RECORDER_CAPTURE_SWEEP_LAG_SECONDS = 1, 0
    recorder_url, agent_url, token = dbhub_postgres
    set_policy(admin_user)
    server = ToolServer.objects.get(name="crm")
    outsider, _ = in_background(lambda: run_text(
        agent_url, "UPDATE contacts SET status = 'outside' WHERE id = 30; SELECT pg_sleep(7)"))
    # The delete runs first (its transaction has an id from then on), then the statement sleeps past the
    # timeout and the settle wait, and commits.
    slow = ("WITH gone AS (DELETE FROM contacts WHERE id <= 5 RETURNING id) "
            "SELECT (SELECT count(*) FROM gone), pg_sleep(5)")
    time.sleep(0.5)
    assert call(recorder, token, "crm__execute_sql", {"sql": slow}).is_error
    timed_out = step_of(slow)
    running = timed_out.earlier_state["left"]["database"]["running"]
    assert [s["ours"] for s in running if s["xid"]].count(True) == 1 and len(running) == 2
    outsider.join(timeout=30)
    time.sleep(1)
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts WHERE id <= 5") == [(0,)]
    journal_services.sweep_capture(server=server)
    journal_services.sweep_capture(server=server)  # the horizon: every transaction running then has ended
    server.refresh_from_db()
    timed_out.refresh_from_db()
    later = timed_out.run.entries.get(event="committed_later").data
    assert (later["step"], later["rows"], later["tables"]) == (timed_out.number, 5, {"public.contacts": 5})
    assert any("committed 5 rows of public.contacts after the call gave up" in p
               for p in timed_out.undo_problems)
    [finding] = server.unrecorded
    assert (finding["rows"], finding["tables"]) == (1, {"public.contacts": 1})
    assert finding["probably"] == [{"run": str(timed_out.run.public_id), "step": timed_out.number, "rows": 1}]
    web = Client()
    web.force_login(admin_user)
    page = web.get(f"/servers/{server.pk}/").content.decode()
    assert "1 row of public.contacts" in page and f"step {timed_out.number}</a> when its call gave up" in page
    [notice] = Notice.objects.all()
    assert (notice.event, notice.server_name, notice.data["rows"]) == ("capture_unrecorded", "crm", 1)
    assert notice.data["words"] == "1 row of public.contacts changed by no recorded call to crm"
