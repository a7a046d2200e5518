"""A destruction a person approves is kept first (issue 45, item 6): before a held `DROP TABLE`, `TRUNCATE`
or whole-table `DELETE` is sent, the Recorder keeps the table (definition and rows) where the agent cannot
reach it, so the step is undoable: the table re-created and reloaded, under the same checks and signatures,
with the run's earlier row changes to it chained behind."""

import sqlite3
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from approver import services, tasks
from journal import services as journal_services
from journal.models import Run, Step
from tests.journal.helpers import run_agent
from tests.journal.undo.databases import CONTACTS, dbhub_crm, pg_rows, postgres_crm, rows
from tests.services import POSTGRES_URL, needs_node, needs_postgres, needs_sqlite_server

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_database_undo import crm, snapshot  # noqa: F401 - fixture
from .test_executor import run_plan
from .test_held_calls import decide, held, in_background, set_policy

pytestmark = [pytest.mark.django_db(transaction=True)]


def approved(recorder, token, approver_user, tool: str, arguments: dict, *, seen: list | None = None):
    """The agent's call, held for a person, approved, and what the agent got (`seen`: the held call's page,
    as the approver saw it)."""
    thread, box = in_background(lambda: run_agent(recorder, token, lambda c: c.call_tool(tool, arguments)))
    action = held()
    if seen is not None:
        web = Client()
        web.force_login(approver_user)
        seen.append(web.get(f"/actions/{action.public_id}/").content.decode())
    decide(action, approver_user, "approve")
    thread.join(timeout=60)
    return box["result"]


@needs_sqlite_server
def test_an_approved_drop_is_kept_first_and_undone_with_the_rows_changed_before_it(
        recorder, crm, admin_user, on_call, approver_user, second_approver, settings):  # noqa: F811
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    path, token = crm
    set_policy(admin_user)
    before = snapshot(path)
    run_agent(recorder, token, lambda c: c.call_tool(
        "crm__write_query", {"query": "UPDATE contacts SET status = 'archived' WHERE id <= 40"}))
    said = approved(recorder, token, approver_user, "crm__write_query", {"query": "DROP TABLE contacts"})
    assert not said.is_error, said.content[0].text
    assert rows(path, "SELECT count(*) FROM sqlite_master WHERE name = 'contacts'") == [(0,)]
    run = Run.objects.get(agent__name="cleanup-bot")
    steps = {s.number: s for s in run.steps.all()}
    assert (steps[2].reversibility, steps[2].effect_summary) == (
        "compensate", f"Dropped table contacts ({CONTACTS:,} rows): kept beforehand, so it can be undone.")
    kept = steps[2].earlier_state["database"]["kept"][0]
    assert kept["rows"] == CONTACTS and kept["copy"].startswith("_undo_capture_snap_")
    # The agent cannot read the copy through any tool: it is the capture's.
    result = run_agent(recorder, token, lambda c: c.call_tool(
        "crm__read_query", {"query": f"SELECT * FROM {kept['copy']}"}))
    assert result.is_error and "capture" in result.content[0].text

    plan = services.request_plan(run=run, requested_by=on_call, reason="the cleanup dropped contacts",
                                 from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    items = {i.step.number: i for i in plan.items.select_related("step")}
    assert items[2].position < items[1].position
    assert items[2].check_status == "ok", items[2].check_detail
    assert items[2].check_detail["wouldDo"] == f"Re-create table contacts and reload its {CONTACTS:,} rows"
    assert items[1].check_status == "ok" and items[1].check_detail["rows"]["restore"] == 40  # chained
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(plan)
    report = {i.step.number: (i.outcome, i.outcome_detail["message"])
              for i in plan.items.select_related("step") if i.step.number < 3}  # 3: the refused read
    assert report == {
        2: ("compensated", f"Re-created table contacts and reloaded its {CONTACTS:,} rows."),
        1: ("compensated", "Put back 40 rows of contacts.")}
    assert snapshot(path) == before
    # The re-created table is captured again: the agent's next change can be undone row by row.
    run_agent(recorder, token, lambda c: c.call_tool(
        "crm__write_query", {"query": "UPDATE contacts SET status = 'x' WHERE id = 1"}))
    last = Run.objects.get(agent__name="cleanup-bot").steps.order_by("-number")[0]
    assert (last.reversibility, last.effect_summary) == ("compensate", "Updated 1 row of contacts.")


@needs_node
@needs_postgres
def test_on_postgresql_an_approved_truncate_is_kept_and_reloaded(
        recorder, admin_user, dana, on_call, approver_user, second_approver, settings, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    with postgres_crm(POSTGRES_URL) as (recorder_url, agent_url):
        dbhub_crm(recorder_url, agent_url, by=admin_user)
        token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
        set_policy(admin_user)
        shape = "SELECT id, name, email, status, company_id FROM contacts ORDER BY id"
        before = pg_rows(recorder_url, shape)
        said = approved(recorder, token, approver_user, "crm__execute_sql", {"sql": "TRUNCATE contacts"})
        assert not said.is_error, said.content[0].text
        assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(0,)]
        with psycopg.connect(agent_url, autocommit=True) as agent, pytest.raises(psycopg.Error):
            agent.execute("SELECT count(*) FROM undo_capture.snap_x")  # the copy's schema is not the agent's
        run = Run.objects.get(agent__name="cleanup-bot")
        plan = services.request_plan(run=run, requested_by=on_call, reason="truncated", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        item = plan.items.get()
        assert (item.check_status, item.check_detail["wouldDo"]) == (
            "ok", "Reload 1,196 rows into public.contacts, empty now")
        for user in (approver_user, second_approver):
            approve(plan, user, enrolled(user), choices={})
        plan = run_plan(plan)
        item.refresh_from_db()
        assert (item.outcome, item.outcome_detail["message"]) == (
            "compensated", "Reloaded 1,196 rows into public.contacts.")
        assert pg_rows(recorder_url, shape) == before


@needs_sqlite_server
def test_a_table_filled_again_since_is_a_conflict_its_undo_leaves_alone(
        recorder, crm, admin_user, on_call, approver_user, settings):  # noqa: F811
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    path, token = crm
    set_policy(admin_user)
    seen = []
    approved(recorder, token, approver_user, "crm__write_query", {"query": "DROP TABLE contacts"}, seen=seen)
    assert f"It drops table contacts: {CONTACTS:,} rows." in seen[0]
    assert "If you approve, the Recorder first keeps contacts (its definition and every row)" in seen[0]
    with sqlite3.connect(path) as someone:
        someone.execute("CREATE TABLE contacts (id INTEGER PRIMARY KEY, name TEXT)")
        someone.execute("INSERT INTO contacts VALUES (1, 'new')")
    plan = services.request_plan(run=Run.objects.get(agent__name="cleanup-bot"), requested_by=on_call,
                                 reason="dropped", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    item = plan.items.get()
    assert item.check_status == "conflict"
    assert item.check_detail["message"] == ("Changed since the agent's call: contacts holds 1 row since. Its "
                                            "undo leaves the table as it is.")
    # Once its undo window closes, the kept copy is forgotten with the capture's other rows no undo needs.
    copy = item.step.compensation_arguments["kept"][0]["copy"]
    Step.objects.update(undo_by=timezone.now() - timedelta(minutes=1))
    out = StringIO()
    call_command("capture", "crm", prune=True, stdout=out)
    assert out.getvalue() == f"crm: forgot {CONTACTS:,} captured rows no undo needs any more.\n"
    assert rows(path, "SELECT count(*) FROM sqlite_master WHERE name = ?", copy) == [(0,)]


DEFINITION = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       (SELECT array_agg(pg_get_constraintdef(c.oid) ORDER BY conname) FROM pg_constraint c
        WHERE c.conrelid = 'contacts'::regclass)
FROM pg_attribute a WHERE a.attrelid = 'contacts'::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


@needs_node
@needs_postgres
def test_on_postgresql_an_approved_drop_is_re_created_as_the_catalogue_described_it(
        recorder, admin_user, dana, on_call, approver_user, second_approver, settings, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    with postgres_crm(POSTGRES_URL) as (recorder_url, agent_url):
        with psycopg.connect(agent_url, autocommit=True) as agent:  # a serial column, an index, a check
            agent.execute("ALTER TABLE contacts ADD COLUMN n serial, ADD CONSTRAINT named CHECK (id > 0)")
            agent.execute("CREATE INDEX contacts_by_email ON contacts (email)")
        dbhub_crm(recorder_url, agent_url, by=admin_user)
        token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
        set_policy(admin_user)
        shape = "SELECT id, name, email, status, company_id, n FROM contacts ORDER BY id"
        before, definition = pg_rows(recorder_url, shape), pg_rows(recorder_url, DEFINITION)
        said = approved(recorder, token, approver_user, "crm__execute_sql", {"sql": "DROP TABLE contacts"})
        assert not said.is_error, said.content[0].text
        assert pg_rows(recorder_url, "SELECT to_regclass('contacts') IS NULL") == [(True,)]
        run = Run.objects.get(agent__name="cleanup-bot")
        plan = services.request_plan(run=run, requested_by=on_call, reason="dropped", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        for user in (approver_user, second_approver):
            approve(plan, user, enrolled(user), choices={})
        plan = run_plan(plan)
        item = plan.items.get()
        assert (item.outcome, item.outcome_detail["message"]) == (
            "compensated", "Re-created table public.contacts and reloaded its 1,196 rows.")
        assert pg_rows(recorder_url, shape) == before
        assert pg_rows(recorder_url, DEFINITION) == definition
        assert pg_rows(recorder_url, "SELECT indexdef LIKE '%%(email)' FROM pg_indexes "
                                     "WHERE indexname = 'contacts_by_email'") == [(True,)]
        # its serial goes on where it was, and the capture keeps the table again
        with psycopg.connect(agent_url, autocommit=True) as agent:
            agent.execute("INSERT INTO contacts (id, name, email, status) VALUES (5000, 'a', 'b', 'c')")
        assert pg_rows(recorder_url, "SELECT n FROM contacts WHERE id = 5000") == [(1197,)]
        captured = "SELECT count(*) FROM undo_capture.changes WHERE pk = '[5000]'"
        assert pg_rows(recorder_url, captured) == [(1,)]


@needs_node
@needs_postgres
def test_an_approved_drop_the_database_refuses_is_not_said_to_have_happened_and_its_copy_goes(
        recorder, admin_user, dana, approver_user, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    with postgres_crm(POSTGRES_URL) as (recorder_url, agent_url):
        dbhub_crm(recorder_url, agent_url, by=admin_user)
        token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
        set_policy(admin_user)
        said = approved(recorder, token, approver_user, "crm__execute_sql", {"sql": "DROP TABLE companies"})
        assert said.is_error  # contacts refer to it: PostgreSQL refuses the drop without CASCADE
        step = Run.objects.get(agent__name="cleanup-bot").steps.get()
        assert step.reversibility != "compensate" and "kept beforehand" not in step.effect_summary
        assert step.earlier_state["left"]["database"]["destroyed"] == []
        assert pg_rows(recorder_url, "SELECT count(*) FROM companies") == [(10,)]
        assert pg_rows(recorder_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'undo_capture' "
                                     "AND tablename LIKE 'snap_%%'") == [(0,)]  # the copy is gone
