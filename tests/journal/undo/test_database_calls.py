"""An agent's SQL through the Recorder, read before anything is sent (issue 45): reads pass, row changes on
captured tables are undoable and pass, anything else waits for a person saying what it would destroy, and a
statement that touches the capture is refused whatever the policies say. Against the pinned
mcp-server-sqlite and a real SQLite file."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from approver.models import ActionRequest
from journal import services as journal_services
from journal.models import Step, ToolServer
from tests.approver.services.test_held_calls import call, decide, held, in_background, set_policy
from tests.services import SQLITE_SERVER, needs_sqlite_server

from .databases import CONTACTS, rows, sqlite_crm

pytestmark = [pytest.mark.django_db(transaction=True), needs_sqlite_server]


@pytest.fixture
def crm(tmp_path, admin_user, dana):
    path = tmp_path / "crm.db"
    sqlite_crm(path, by=admin_user)
    return path, journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]


def step(tool_text: str) -> Step:
    return next(s for s in Step.objects.order_by("number") if tool_text in str(s.arguments))


def test_reads_pass_row_changes_pass_and_a_drop_waits_for_a_person_who_keeps_the_table(
        recorder, crm, admin_user, approver_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    path, token = crm
    set_policy(admin_user)
    read = call(recorder, token, "crm__read_query", {"query": "SELECT count(*) AS n FROM contacts"})
    assert not read.is_error and f"'n': {CONTACTS}" in read.content[0].text
    updated = call(recorder, token, "crm__write_query",
                   {"query": "UPDATE contacts SET status = 'archived' WHERE id <= 40"})
    assert "'affected_rows': 40" in updated.content[0].text
    assert (step("SELECT count").reversibility, step("SELECT count").declaration_source) == ("read_only",
                                                                                           "database")
    write = step("archived")
    assert (write.reversibility, write.policy_decision["decision"]) == ("compensate", "allow")
    assert write.earlier_state["database"]["reading"]["statements"][0]["verb"] == "updates rows of contacts"
    # Every row it changed, before and after, from the database itself, on the run's signed record.
    changed = write.earlier_state["left"]["database"]
    assert (changed["count"], changed["tables"]) == (40, {"contacts": {"I": 0, "U": 40, "D": 0}})
    assert changed["rows"][0] == {
        "id": 1, "table": "contacts", "op": "U", "key": [1],
        "before": {"id": 1, "name": "Contact 1", "email": "contact1@example.com", "status": "active",
                   "company_id": 2},
        "after": {"id": 1, "name": "Contact 1", "email": "contact1@example.com", "status": "archived",
                  "company_id": 2}}
    entry = next(e for e in write.run.entries.order_by("seq") if e.event == "result" and
                 e.data.get("step") == write.number)
    assert entry.data["readAfter"]["database"]["sha256"] == changed["sha256"]
    assert journal_services.verify_run(run=write.run).ok

    thread, box = in_background(lambda: call(recorder, token, "crm__write_query",
                                             {"query": "DROP TABLE contacts"}))
    action = held()
    assert "It drops table contacts: 1,196 rows." in action.why.get("reason", "")
    decide(action, approver_user, "reject", reason="keep the table")
    thread.join(timeout=30)
    assert box["result"].is_error and "keep the table" in box["result"].content[0].text
    assert rows(path, "SELECT count(*) FROM contacts") == [(CONTACTS,)]


def test_a_drop_hidden_behind_a_read_is_held_like_any_drop(recorder, crm, admin_user, settings):
    """The reference servers call their read tool read-only; the text decides, not the tool's name."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    path, token = crm
    set_policy(admin_user)
    result = call(recorder, token, "crm__read_query", {"query": "SELECT 1; DROP TABLE contacts"})
    assert result.is_error and "approval" in result.content[0].text.lower()
    action = ActionRequest.objects.get()
    assert action.state == "pending" and "It drops table contacts: 1,196 rows." in action.why["reason"]
    assert rows(path, "SELECT count(*) FROM contacts") == [(CONTACTS,)]


def test_a_statement_that_touches_the_capture_is_refused_whatever_the_policies_say(recorder, crm, admin_user):
    path, token = crm
    set_policy(admin_user, none="allow", unknown="allow")
    call(recorder, token, "crm__write_query", {"query": "UPDATE contacts SET status = 'x' WHERE id = 1"})
    kept = rows(path, "SELECT count(*) FROM _undo_capture_changes")
    assert kept == [(1,)]
    for tool, text in (("write_query", "DELETE FROM _undo_capture_changes"),
                       ("write_query", "DROP TRIGGER _undo_capture_contacts_u"),
                       ("read_query", "SELECT * FROM _undo_capture_changes"),
                       ("write_query", "PRAGMA writable_schema = ON")):
        result = call(recorder, token, f"crm__{tool}", {"query": text})
        assert result.is_error, text
        words = result.content[0].text
        assert "Refused: it touches" in words and "Nothing was sent to crm" in words
        refused = step(text)
        assert (refused.status, refused.policy_decision["decision"], refused.policy_decision["capture"]) == (
            "error", "deny", True)
    assert rows(path, "SELECT count(*) FROM _undo_capture_changes") == kept
    assert rows(path, "SELECT count(*) FROM sqlite_master WHERE name = '_undo_capture_contacts_u'") == [(1,)]


def test_a_change_to_a_table_without_capture_says_so_and_waits(recorder, crm, admin_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    path, token = crm
    set_policy(admin_user)
    call(recorder, token, "crm__write_query", {"query": "UPDATE companies SET name = 'x' WHERE id = 1"})
    action = ActionRequest.objects.get()
    assert action.why["reason"] == ("It updates rows of companies, and companies is not captured (an admin "
                                    "captures a table before agents change it).")
    assert rows(path, "SELECT name FROM companies WHERE id = 1") == [("Company 1",)]


def test_a_database_server_is_registered_with_its_database_and_its_password_is_never_shown(
        tmp_path, admin_user):
    out = StringIO()
    command = f"env DSN=postgres://agent:hunter2@db/crm {SQLITE_SERVER} --db-path {tmp_path / 'x.db'}"
    call_command("add_tool_server", "pg", stdio_command=command,
                 database="postgresql://recorder:s3cret@db.internal:5432/crm", stdout=out, stderr=StringIO())
    assert "pg: its SQL acts on postgresql://recorder:***@db.internal:5432/crm" in out.getvalue()
    assert "s3cret" not in out.getvalue()
    server = ToolServer.objects.get(name="pg")
    assert server.database_shown == "postgresql://recorder:***@db.internal:5432/crm"
    web = Client()
    web.force_login(admin_user)
    page = web.get(f"/servers/{server.pk}/").content.decode()
    assert "postgresql://recorder:***@db.internal:5432/crm" in page and "postgres://agent:***@db/crm" in page
    assert "s3cret" not in page and "hunter2" not in page
    with pytest.raises(CommandError, match="database: 'ftp://x' is neither a PostgreSQL URL"):
        call_command("add_tool_server", "pg", update=True, database="ftp://x", stdout=out, stderr=StringIO())


def test_two_agents_writing_one_database_at_once_each_get_exactly_their_own_rows(
        recorder, crm, admin_user, dana):
    path, first = crm
    second = journal_services.create_agent(name="other-bot", on_behalf_of=dana)[1]
    set_policy(admin_user)
    calls = [(first, "UPDATE contacts SET status = 'archived' WHERE id <= 40"),
             (second, "DELETE FROM contacts WHERE id BETWEEN 101 AND 125"),
             (first, "UPDATE contacts SET name = 'x' WHERE id BETWEEN 500 AND 502"),
             (second, "INSERT INTO contacts (id, name, email, status) "
                      "VALUES (9001, 'f', 'f@x.test', 'lead')")]
    threads = [in_background(lambda token=token, sql=sql: call(recorder, token, "crm__write_query",
                                                               {"query": sql})) for token, sql in calls]
    for thread, _ in threads:
        thread.join(timeout=60)
    assert all(not box["result"].is_error for _, box in threads)
    counted = {s.arguments["query"]: s.earlier_state["left"]["database"]["tables"]["contacts"]
               for s in Step.objects.all()}
    assert counted == {calls[0][1]: {"I": 0, "U": 40, "D": 0}, calls[1][1]: {"I": 0, "U": 0, "D": 25},
                       calls[2][1]: {"I": 0, "U": 3, "D": 0}, calls[3][1]: {"I": 1, "U": 0, "D": 0}}
    assert rows(path, "SELECT count(*) FROM _undo_capture_changes") == [(69,)]
