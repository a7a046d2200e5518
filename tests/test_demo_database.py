"""The demo's database story (issue 45, item 8), as `make demo` tells it and the README walks it: the
customer database behind the pinned mcp-server-sqlite with the capture on; cleanup-bot deletes the 1,196
inactive contacts, inserts 4 fake ones, and tries to drop the companies table, which waits for an approver;
on-call undoes the rest, two approvers sign, and every contact is back, the fake ones gone."""

import io
import secrets

import psycopg
import pytest

from approver import demo_database, services, tasks
from approver.models import ActionRequest
from journal import services as journal_services
from journal.models import Run
from tests.approver.services.test_approvals import approve, enrolled, relying_party  # noqa: F401
from tests.approver.services.test_executor import run_plan
from tests.approver.services.test_held_calls import set_policy
from tests.journal.helpers import run_agent
from tests.journal.undo.databases import pg_rows, postgres_url, rows
from tests.services import POSTGRES_URL, needs_node, needs_postgres, needs_sqlite_server

pytestmark = [pytest.mark.django_db(transaction=True)]


@needs_sqlite_server
def test_the_demo_cleanup_is_undone_but_for_the_drop_which_waits(
        recorder, tmp_path, admin_user, dana, on_call, approver_user, second_approver, settings, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    said = io.StringIO()
    server = demo_database.ensure_customers(tmp_path, by=admin_user, say=lambda text: said.write(text))
    assert "the capture on companies, contacts" in said.getvalue()
    path = tmp_path / "demo-customers.db"
    before = rows(path, "SELECT * FROM contacts ORDER BY id")
    assert len(before) == 2400
    set_policy(admin_user)
    token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]

    async def script(client):
        return [await client.call_tool(name, arguments)
                for name, arguments in demo_database.story(demo_database.where(tmp_path)[3])]

    answers = run_agent(recorder, token, script)
    assert [a.is_error for a in answers] == [False, False, False, True]  # the drop waits for a person
    assert rows(path, "SELECT count(*) FROM contacts") == [(2400 - 1196 + 4,)]
    assert rows(path, "SELECT count(*) FROM companies") == [(40,)]
    held = ActionRequest.objects.get(state=ActionRequest.State.PENDING, server=server)
    assert "cannot be undone (It drops table companies: 40 rows.)" in held.reason
    run = Run.objects.get(agent__name="cleanup-bot")
    steps = {s.number: s for s in run.steps.all()}
    assert [steps[n].effect_summary for n in (2, 3)] == ["Deleted 1,196 rows of contacts.",
                                                         "Inserted 4 rows of contacts."]
    plan = services.request_plan(run=run, requested_by=on_call, reason="the cleanup deleted customers",
                                 from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(plan)
    report = {i.step.number: i.outcome_detail.get("message") for i in plan.items.select_related("step")
              if i.outcome == "compensated"}
    assert report == {2: "Re-inserted 1,196 deleted rows of contacts.",
                      3: "Deleted the 4 rows of contacts the agent inserted."}
    assert rows(path, "SELECT * FROM contacts ORDER BY id") == before


@needs_node
@needs_postgres
def test_on_postgresql_the_demo_database_is_served_by_dbhub_and_its_drop_waits(
        recorder, tmp_path, admin_user, dana, settings, monkeypatch):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    name = f"demo_customers_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url(POSTGRES_URL, database=name)
    monkeypatch.setenv("DEMO_CUSTOMERS_DATABASE", url)
    try:
        server = demo_database.ensure_customers(tmp_path, by=admin_user, say=lambda text: None)
        assert server.recipe_pack == "dbhub" and server.database == url
        set_policy(admin_user)
        token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]

        async def script(client):
            tool = demo_database.where(tmp_path)[3]
            return [await client.call_tool(n, a) for n, a in demo_database.story(tool)]

        answers = run_agent(recorder, token, script)
        assert [a.is_error for a in answers] == [False, False, False, True]
        assert pg_rows(url, "SELECT count(*) FROM contacts") == [(2400 - 1196 + 4,)]
        steps = {s.number: s for s in Run.objects.get(agent__name="cleanup-bot").steps.all()}
        assert [steps[n].reversibility for n in (2, 3)] == ["compensate", "compensate"]
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
