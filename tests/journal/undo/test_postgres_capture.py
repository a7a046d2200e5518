"""The capture on PostgreSQL (issue 45): row-level triggers in a schema the agent's role cannot read, write
or drop, even when it owns the tables; an event trigger that refuses any statement switching a capture
trigger off; and an agent's SQL through the pinned DBHub, whose rows land on the run's signed record with
the role that wrote them."""

import psycopg
import pytest
from django.core.management import call_command
from mcp.shared.exceptions import MCPError

from approver import services
from journal import services as journal_services
from journal.models import Step, ToolServer
from tests.approver.services.test_held_calls import call, decide, held, in_background, set_policy
from tests.journal.helpers import run_agent
from tests.services import POSTGRES_URL, needs_node, needs_postgres

from .databases import AGENT_ROLE, CONTACTS, pg_rows, postgres_crm, server_command

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgres]


@pytest.fixture
def crm():
    with postgres_crm(POSTGRES_URL) as urls:
        yield urls


@pytest.fixture
def captured(crm, capsys):
    recorder, _ = crm
    journal_services.register_tool_server(name="crm", command="true", database=recorder)
    call_command("capture", "crm", tables="contacts,companies", agent_roles=[AGENT_ROLE])
    return crm


def test_the_agents_role_cannot_read_change_or_switch_off_the_capture_even_owning_the_tables(captured):
    recorder, agent = captured
    with psycopg.connect(agent, autocommit=True) as connection:
        connection.execute("UPDATE contacts SET status = 'x' WHERE id = 1")
        for statement in ("SELECT * FROM undo_capture.changes", "DELETE FROM undo_capture.changes",
                          "DROP TABLE undo_capture.changes", "DROP TRIGGER undo_capture ON contacts",
                          "ALTER TABLE contacts DISABLE TRIGGER undo_capture",
                          "ALTER TABLE contacts DISABLE TRIGGER ALL",
                          "ALTER TABLE contacts DISABLE TRIGGER USER",
                          "ALTER TABLE contacts ENABLE REPLICA TRIGGER undo_capture",
                          "DROP SCHEMA undo_capture CASCADE",
                          "SET session_replication_role = replica"):
            with pytest.raises(psycopg.Error):
                connection.execute(statement)
        # Saying it is the Recorder's undo does not make its writes pass uncaptured: it is not the Recorder.
        connection.execute("SET undo_capture.restoring = 'on'")
        connection.execute("UPDATE contacts SET status = 'y' WHERE id = 2")
    kept = pg_rows(recorder, "SELECT tbl, op, pk, before ->> 'status', after ->> 'status', who "
                             "FROM undo_capture.changes ORDER BY id")
    assert kept == [("public.contacts", "U", [1], "active", "x", AGENT_ROLE),
                    ("public.contacts", "U", [2], "active", "y", AGENT_ROLE)]
    switched_on = "SELECT count(*) FROM pg_trigger WHERE tgname = 'undo_capture' AND tgenabled = 'O'"
    assert pg_rows(recorder, switched_on) == [(2,)]


def test_the_capture_says_which_tables_it_keeps(captured, capsys):
    call_command("capture", "crm")
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "public.companies: captured", "public.contacts: captured",
        "public.notes: not captured: it has no primary key"]


def test_a_dba_gets_the_sql_to_run_instead(crm, capsys):
    recorder, _ = crm
    journal_services.register_tool_server(name="crm", command="true", database=recorder)
    call_command("capture", "crm", tables="contacts", sql=True)
    text = capsys.readouterr().out
    assert "CREATE TRIGGER undo_capture AFTER INSERT OR UPDATE OR DELETE ON \"public\".\"contacts\"" in text
    assert pg_rows(recorder, "SELECT count(*) FROM pg_trigger WHERE tgname = 'undo_capture'") == [(0,)]
    with pytest.raises(Exception, match="notes has no primary key"):
        call_command("capture", "crm", tables="notes")


def served_by(pack: str, agent_url: str, admin_user) -> None:
    """The registered crm server, now the pinned server of `pack` over the agent's URL, its pack in force."""
    server = journal_services.refresh_catalogue(server=journal_services.save_tool_server(
        server=ToolServer.objects.get(name="crm"), command=server_command(pack, agent_url)))
    services.use_pack(server=server, pack=pack, by=admin_user)


@needs_node
def test_an_agents_update_through_dbhub_lands_on_the_record_row_by_row(captured, recorder, admin_user, dana):
    recorder_url, agent_url = captured
    served_by("dbhub", agent_url, admin_user)
    set_policy(admin_user)
    token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
    result = call(recorder, token, "crm__execute_sql",
                  {"sql": "UPDATE contacts SET status = 'archived' WHERE id <= 40; "
                          "SELECT count(*) FROM contacts"})
    assert not result.is_error, result.content[0].text
    step = Step.objects.get(tool="execute_sql")
    assert (step.reversibility, step.policy_decision["decision"]) == ("compensate", "allow")
    changed = step.earlier_state["left"]["database"]
    assert (changed["count"], changed["tables"]) == (40, {"public.contacts": {"I": 0, "U": 40, "D": 0}})
    assert {row["who"] for row in changed["rows"]} == {AGENT_ROLE}
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts WHERE status = 'archived'") == [(40,)]
    assert CONTACTS == pg_rows(recorder_url, "SELECT count(*) FROM contacts")[0][0]


@needs_node
def test_a_hostile_agent_cannot_touch_the_capture_through_its_sql_tool(captured, recorder, admin_user, dana):
    """Whatever the policies allow: refused before anything is sent, and the record keeps every row image."""
    recorder_url, agent_url = captured
    served_by("dbhub", agent_url, admin_user)
    set_policy(admin_user, none="allow", unknown="allow")
    token = journal_services.create_agent(name="hostile-bot", on_behalf_of=dana)[1]
    call(recorder, token, "crm__execute_sql", {"sql": "UPDATE contacts SET status = 'x' WHERE id <= 3"})
    for sql in ("DROP TRIGGER undo_capture ON contacts", "ALTER TABLE contacts DISABLE TRIGGER ALL",
                "ALTER TABLE contacts DISABLE TRIGGER undo_capture", "SELECT * FROM undo_capture.changes",
                "DELETE FROM undo_capture.changes", "SET session_replication_role = replica",
                "SELECT 1; COMMIT; DROP SCHEMA undo_capture CASCADE", "DROP EVENT TRIGGER undo_capture_guard",
                "UPDATE contacts SET status = 'y'; TRUNCATE undo_capture.changes"):
        result = call(recorder, token, "crm__execute_sql", {"sql": sql})
        assert result.is_error and "Refused: it touches" in result.content[0].text, sql
    steps = list(Step.objects.order_by("number"))
    assert [s.policy_decision["decision"] for s in steps] == ["allow"] + ["deny"] * 9
    assert steps[0].earlier_state["left"]["database"]["count"] == 3
    switched_on = "SELECT count(*) FROM pg_trigger WHERE tgname = 'undo_capture' AND tgenabled = 'O'"
    assert pg_rows(recorder_url, switched_on) == [(2,)]
    assert pg_rows(recorder_url, "SELECT count(*) FROM undo_capture.changes") == [(3,)]
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts WHERE status = 'y'") == [(0,)]
    assert journal_services.verify_run(run=steps[0].run).ok


@needs_node
def test_the_reference_postgres_servers_read_only_query_cannot_be_escaped_with_a_commit(
        captured, recorder, admin_user, dana, approver_user, settings):
    """@modelcontextprotocol/server-postgres runs `query` in a read-only transaction that a COMMIT inside the
    text ends (its known escape). The statements decide: reads pass, the escape waits for a person, and an
    UPDATE the server refuses is recorded as changing nothing, because the capture says so."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    recorder_url, agent_url = captured
    served_by("postgres", agent_url, admin_user)
    set_policy(admin_user)
    token = journal_services.create_agent(name="report-bot", on_behalf_of=dana)[1]
    read = call(recorder, token, "crm__query", {"sql": "SELECT count(*) AS n FROM contacts"})
    assert not read.is_error and str(CONTACTS) in read.content[0].text
    async def update(client):
        try:
            await client.call_tool("crm__query", {"sql": "UPDATE contacts SET status = 'x' WHERE id = 1"})
        except MCPError as exc:  # the server's own JSON-RPC error, relayed as it came
            return str(exc)

    assert "read-only transaction" in run_agent(recorder, token, update)
    update = Step.objects.get(arguments__sql__startswith="UPDATE")
    assert (update.reversibility, update.effect_summary) == ("read_only", "It changed no rows.")
    thread, box = in_background(lambda: call(recorder, token, "crm__query",
                                             {"sql": "SELECT 1; COMMIT; DROP TABLE contacts CASCADE"}))
    action = held()
    assert "It drops table contacts" in action.why["reason"]
    decide(action, approver_user, "reject", reason="a read tool does not drop tables")
    thread.join(timeout=30)
    assert box["result"].is_error
    assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS,)]
