"""Statements over the bound the run's record keeps (issue 45, item 5): the record keeps their count and
digest, the rows stay in the database's capture, and the check and the undo read them from there, a batch at
a time, after proving they are the rows the record signed. Two such steps on the same rows chain as any
others do; a capture that lost or changed a row stops the undo before it changes anything."""

import sqlite3
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from approver import database_checks, sentence, services
from journal.models import Run, Step
from journal.undo.database.rows import Change
from journal.upstream import captured, database, restore, windows
from tests.journal.helpers import run_agent
from tests.journal.undo.databases import AGENT_ROLE, pg_rows, postgres_crm, rows
from tests.services import POSTGRES_URL, needs_postgres, needs_sqlite_server

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_database_undo import crm, snapshot  # noqa: F401 - fixture
from .test_executor import run_plan
from .test_held_calls import set_policy

pytestmark = [pytest.mark.django_db(transaction=True)]


@needs_sqlite_server
def test_big_statements_are_checked_and_undone_from_the_capture_and_chain_on_shared_rows(
        recorder, crm, admin_user, on_call, approver_user, second_approver, settings):  # noqa: F811
    settings.RECORDER_DATABASE_ROWS_KEPT = 50
    path, token = crm
    set_policy(admin_user)
    before = snapshot(path)

    async def script(client):
        for query in ("UPDATE contacts SET name = 'Contact one' WHERE id = 1",
                      "UPDATE contacts SET status = 'archived' WHERE id <= 600",
                      "UPDATE contacts SET status = 'gone' WHERE id BETWEEN 501 AND 700",
                      "DELETE FROM contacts WHERE id > 1000"):
            await client.call_tool("crm__write_query", {"query": query})

    run_agent(recorder, token, script)
    run = Run.objects.get(agent__name="cleanup-bot")
    steps = {s.number - 1: s for s in run.steps.all()}  # numbered as the big statements, 1 to 3
    kept = steps[1].earlier_state["left"]["database"]
    assert (kept["count"], kept["inCapture"], kept["rows"]) == (600, True, None)
    assert len(kept["sha256"]) == 64 and steps[1].compensation_arguments["inCapture"] is True
    assert steps[3].effect_summary == "Deleted 196 rows of contacts."
    assert len(steps[0].earlier_state["left"]["database"]["rows"]) == 1  # under the bound: in the record
    # Pruning forgets the small call's row (the record keeps it), keeps the big ones' (their window is open).
    out = StringIO()
    call_command("capture", "crm", prune=True, stdout=out)
    assert out.getvalue() == "crm: forgot 1 captured row no undo needs any more.\n"
    assert rows(path, "SELECT count(*) FROM _undo_capture_changes") == [(996,)]
    with sqlite3.connect(path) as person:  # afterwards: a field the agent changed, and one it did not
        person.execute("UPDATE contacts SET status = 'customer' WHERE id = 650")
        person.execute("UPDATE contacts SET email = 'new10@example.com' WHERE id = 10")

    plan = services.request_plan(run=run, requested_by=on_call, reason="bad cleanup", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    items = {i.step.number - 1: i for i in plan.items.select_related("step")}
    assert items[0].check_status == "ok"
    assert items[1].check_status == "ok" and items[1].check_detail["rows"] == {
        "restore": 600, "undone": 0, "conflict": 0}  # rows 501-600 as step 2's undo will leave them
    assert items[1].check_detail["chained"]
    assert items[1].check_detail["kept"][0]["fields"][0]["now"] == "new10@example.com"
    assert items[2].check_status == "conflict" and items[2].check_detail["rows"] == {
        "restore": 199, "undone": 0, "conflict": 1}
    assert items[2].check_detail["conflicts"][0]["key"] == [650]
    assert items[3].check_detail["rows"]["restore"] == 196
    assert "Its 600 changed rows are over what the run's record keeps" in items[1].check_detail["inCapture"]

    web = Client()
    web.force_login(approver_user)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert page.count("data-in-capture") == 3 and "keeps them until the undo window closes" in page
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={str(items[2].position): "keep_newer"})
    plan.refresh_from_db()
    signed = sentence.of_items(list(plan.items.select_related("step").order_by("position"))).text()
    assert signed.count("its rows read from the database's capture") == 3
    plan = run_plan(plan)
    report = {i.step.number - 1: i.outcome_detail["message"] for i in plan.items.select_related("step")}
    assert report == {0: "Put back 1 row of contacts.", 1: "Put back 600 rows of contacts.",
                      2: "Put back 199 rows of contacts; 1 row changed since by someone else, kept as the "
                         "approvers chose.",
                      3: "Re-inserted 196 deleted rows of contacts."}
    assert snapshot(path) == [(i, n, "new10@example.com" if i == 10 else e, "customer" if i == 650 else s, c)
                              for (i, n, e, s, c) in before]


@needs_sqlite_server
def test_a_capture_that_lost_a_row_stops_the_check_and_the_undo_before_anything_changes(
        recorder, crm, admin_user, on_call, approver_user, second_approver, settings):  # noqa: F811
    settings.RECORDER_DATABASE_ROWS_KEPT = 10
    path, token = crm
    set_policy(admin_user)
    run_agent(recorder, token, lambda client: client.call_tool(
        "crm__write_query", {"query": "UPDATE contacts SET status = 'archived' WHERE id <= 100"}))
    run = Run.objects.get(agent__name="cleanup-bot")
    plan = services.request_plan(run=run, requested_by=on_call, reason="undo", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    item = plan.items.get()
    assert item.check_status == "ok"
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    with sqlite3.connect(path) as someone:  # the capture loses one of the call's rows after the signatures
        someone.execute("DELETE FROM _undo_capture_changes WHERE id = (SELECT max(id) FROM "
                        "_undo_capture_changes)")
    plan = run_plan(plan)
    item.refresh_from_db()
    assert item.outcome == "compensation_failed"
    assert "no longer holds the 100 rows the record signed for it (it holds 99" in \
        item.outcome_detail["message"]
    assert rows(path, "SELECT count(*) FROM contacts WHERE status = 'archived'") == [(100,)]  # untouched
    assert database_checks.check(place=str(path), earlier=item.step.earlier_state)[0] == "error"



@needs_sqlite_server
def test_once_its_undo_window_closes_a_big_statements_rows_are_forgotten_and_its_check_says_so(
        recorder, crm, admin_user, settings):  # noqa: F811
    settings.RECORDER_DATABASE_ROWS_KEPT = 10
    path, token = crm
    set_policy(admin_user)
    run_agent(recorder, token, lambda client: client.call_tool(
        "crm__write_query", {"query": "UPDATE contacts SET status = 'archived' WHERE id <= 100"}))
    Step.objects.update(undo_by=timezone.now() - timedelta(minutes=1))
    call_command("capture", "crm", prune=True, stdout=StringIO())
    assert rows(path, "SELECT count(*) FROM _undo_capture_changes") == [(0,)]
    status, detail = database_checks.check(place=str(path), earlier=Step.objects.get().earlier_state)
    assert status == "error" and "no longer holds the 100 rows the record signed for it (it holds 0 in" \
        in detail["message"]


@needs_postgres
def test_on_postgresql_the_capture_is_read_by_range_and_role_while_another_role_writes_too():
    """Another role's rows in the same range are not the call's: the check and the undo read only the
    agent's, by the role the record names."""
    with postgres_crm(POSTGRES_URL) as (recorder_url, agent_url):
        database.install(recorder_url, ["contacts"], agent_roles=[AGENT_ROLE])
        window = windows.opened(recorder_url)
        with psycopg.connect(agent_url, autocommit=True) as agent, \
                psycopg.connect(recorder_url, autocommit=True) as person:
            agent.execute("UPDATE contacts SET status = 'archived' WHERE id <= 300")
            person.execute("UPDATE contacts SET name = 'Renamed' WHERE id = 900")  # not the agent's
            agent.execute("DELETE FROM contacts WHERE id > 1100")
        found = windows.closed(window, tables=["contacts", "public.contacts"], keep=20)
        assert (found["count"], found["inCapture"], found["who"]) == (396, True, [AGENT_ROLE])
        earlier = {"left": {"database": found}}
        with psycopg.connect(recorder_url, autocommit=True) as person:
            person.execute("UPDATE contacts SET status = 'customer' WHERE id = 7")
        status, detail = database_checks.check(place=recorder_url, earlier=earlier)
        assert (status, detail["rows"]) == ("conflict", {"restore": 395, "undone": 0, "conflict": 1})
        rows_kept = captured.CallRows(found)
        with database.connected(recorder_url) as connection, captured.snapshot(connection):
            batch = next(rows_kept.batches(connection))[:3]
            assert rows_kept.firsts(connection, batch) == {c.identity(): c.before for c in batch}
        assert captured.prune(recorder_url, upto=found["to"], needed=[(found["from"], found["to"])]) == 0
        conflict = detail["conflicts"][0]
        leave = {Change(conflict["table"], conflict["key"], None, None).identity()}
        done = restore.put_back(recorder_url, rows_kept, marker="big-1", overrides={}, leave=leave)
        assert (done["restored"], done["left"]) == (395, 1)
        again = restore.put_back(recorder_url, rows_kept, marker="big-1", overrides={}, leave=set())
        assert again["again"] is True and again["restored"] == 395
        assert pg_rows(recorder_url, "SELECT count(*) FROM contacts WHERE status = 'archived'") == [(0,)]
        assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(1196,)]
        shape = "SELECT name, status FROM contacts WHERE id IN (7, 900) ORDER BY id"
        assert pg_rows(recorder_url, shape) == [("Contact 7", "customer"), ("Renamed", "lead")]
        assert captured.prune(recorder_url, upto=found["to"], needed=[]) == 397  # the person's row too

