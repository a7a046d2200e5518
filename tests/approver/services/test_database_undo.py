"""Undo an agent's database writes row by row (issue 45's "done when", on SQLite through the pinned
mcp-server-sqlite): an agent reads, updates 40 rows, deletes 25, inserts 3, deletes a row inside a WITH,
and tries to drop a table twice (held, then denied; and behind a read); a person then changes one updated
row's email and another's status; on-call undoes from step 1 and two approvers sign, keeping the newer
change. The database then holds every row as before the agent but the status the person changed, and the
report says exactly that."""

import sqlite3

import psycopg
import pytest
from django.test import Client

from approver import sentence, services, tasks
from journal import services as journal_services
from journal.models import Run
from tests.journal.helpers import run_agent
from tests.journal.undo.databases import (
    CONTACTS,
    dbhub_crm,
    pg_rows,
    postgres_crm,
    rows,
    sqlite_crm,
)
from tests.services import POSTGRES_URL, needs_node, needs_postgres, needs_sqlite_server

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import run_plan
from .test_held_calls import decide, held, in_background, set_policy

pytestmark = [pytest.mark.django_db(transaction=True), needs_sqlite_server]


@pytest.fixture
def crm(tmp_path, admin_user, dana, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    path = tmp_path / "crm.db"
    sqlite_crm(path, by=admin_user)
    return path, journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]


def snapshot(path) -> list[tuple]:
    return rows(path, "SELECT id, name, email, status, company_id FROM contacts ORDER BY id")


def test_an_agents_cleanup_is_undone_row_by_row_and_a_persons_later_changes_are_kept(
        recorder, crm, admin_user, on_call, approver_user, second_approver, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    path, token = crm
    set_policy(admin_user)
    before = snapshot(path)

    async def script(client):
        said = []
        for tool, query in (
                ("read_query", "SELECT count(*) AS n FROM contacts WHERE status = 'lead'"),
                ("write_query", "UPDATE contacts SET status = 'archived' WHERE id <= 40"),
                ("write_query", "DELETE FROM contacts WHERE id BETWEEN 101 AND 125"),
                ("write_query", "INSERT INTO contacts (id, name, email, status) VALUES "
                                "(9001, 'Fake 1', 'f1@x.test', 'lead'), "
                                "(9002, 'Fake 2', 'f2@x.test', 'lead'), "
                                "(9003, 'Fake 3', 'f3@x.test', 'lead')"),
                ("write_query", "WITH doomed AS (SELECT id FROM contacts WHERE id = 200) "
                                "DELETE FROM contacts WHERE id IN doomed"),
                ("read_query", "SELECT 1; DROP TABLE contacts")):
            said.append(await client.call_tool(f"crm__{tool}", {"query": query}))
        return said

    said = run_agent(recorder, token, script)
    assert "'affected_rows': 40" in said[1].content[0].text
    assert "'affected_rows': 25" in said[2].content[0].text
    assert said[5].is_error  # behind a read tool, a drop: held for a person
    thread, box = in_background(lambda: run_agent(recorder, token, lambda c: c.call_tool(
        "crm__write_query", {"query": "DROP TABLE contacts"})))
    decide(held(), approver_user, "reject", reason="never drop production tables")
    thread.join(timeout=30)
    assert box["result"].is_error
    assert rows(path, "SELECT count(*) FROM contacts") == [(CONTACTS - 25 + 3 - 1,)]

    run = Run.objects.get(agent__name="cleanup-bot")
    steps = {s.number: s for s in run.steps.all()}
    # The WITH-delete: mcp-server-sqlite answers it as a query (it does not start with DELETE), and SQLite
    # commits it all the same: the capture, not the server's answer, says what it did.
    assert said[4].content[0].text == "[]"
    assert (steps[5].reversibility, steps[5].effect_summary) == ("compensate", "Deleted 1 row of contacts.")
    assert rows(path, "SELECT count(*) FROM contacts WHERE id = 200") == [(0,)]
    assert steps[2].effect_summary == "Updated 40 rows of contacts."

    # A person, afterwards: one updated row's email (a field the agent did not change), another's status.
    with sqlite3.connect(path) as person:
        person.execute("UPDATE contacts SET email = 'new5@example.com' WHERE id = 5")
        person.execute("UPDATE contacts SET status = 'customer' WHERE id = 7")

    plan = services.request_plan(run=run, requested_by=on_call, reason="bad cleanup", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    items = {i.step.number: i for i in plan.items.select_related("step")}
    update = items[2]
    assert update.check_status == "conflict" and update.tool == "restore_rows"
    assert update.check_detail["rows"] == {"restore": 39, "undone": 0, "conflict": 1}
    assert update.check_detail["conflicts"][0]["fields"] == [
        {"field": "status", "before": "active", "agent": "archived", "now": "customer"}]
    assert update.check_detail["kept"][0]["fields"] == [
        {"field": "email", "before": "contact5@example.com", "agent": "contact5@example.com",
         "now": "new5@example.com"}]
    assert items[3].check_status == "ok" and "25 rows of contacts" in items[3].check_detail["wouldDo"]
    assert items[4].check_status == "ok"
    assert items[5].check_status == "ok" and items[1].action == "nothing_to_undo"

    web = Client()
    web.force_login(approver_user)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert 'data-row="contacts 7"' in page and "<mark>customer</mark>" in page  # the conflict, field by field
    assert "Keep the 1 row changed since as they are now, and put back the rest" in page
    assert "contacts <code>5</code>'s email (now “new5@example.com”)" in page  # kept either way
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={str(update.position): "keep_newer"})
    plan.refresh_from_db()
    signed = sentence.of_items(list(plan.items.select_related("step").order_by("position"))).text()
    assert "the 1 row changed since by someone else" in signed.split("It will not touch:")[1]
    plan = run_plan(plan)
    outcomes = {i.step.number: i.outcome for i in plan.items.select_related("step")}
    assert outcomes[2] == outcomes[3] == outcomes[4] == outcomes[5] == "compensated"
    expected = [(i, n, "new5@example.com" if i == 5 else e, "customer" if i == 7 else s, c)
                for (i, n, e, s, c) in before]
    assert snapshot(path) == expected
    report = {i.step.number: i.outcome_detail["message"] for i in plan.items.select_related("step")}
    assert report[2] == ("Put back 39 rows of contacts; 1 row changed since by someone else, kept as the "
                         "approvers chose.")
    assert report[3] == "Re-inserted 25 deleted rows of contacts."
    assert report[4] == "Deleted the 3 rows of contacts the agent inserted."
    assert report[5] == "Re-inserted 1 deleted row of contacts."
    assert journal_services.verify_run(run=run).ok


@needs_node
@needs_postgres
def test_on_postgresql_through_dbhub_the_same_cleanup_is_undone_and_another_roles_changes_are_kept(
        recorder, admin_user, dana, on_call, approver_user, second_approver, settings, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    settings.RECORDER_HOLD_WAIT_SECONDS = 1
    with postgres_crm(POSTGRES_URL) as (recorder_url, agent_url):
        dbhub_crm(recorder_url, agent_url, by=admin_user)
        token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
        set_policy(admin_user)
        shape = "SELECT id, name, email, status, company_id FROM contacts ORDER BY id"
        before = pg_rows(recorder_url, shape)

        async def script(client):
            return [await client.call_tool("crm__execute_sql", {"sql": sql}) for sql in (
                "SELECT count(*) FROM contacts WHERE status = 'lead'",
                "UPDATE contacts SET status = 'archived' WHERE id <= 40",
                "DELETE FROM contacts WHERE id BETWEEN 101 AND 125",
                "INSERT INTO contacts (id, name, email, status) VALUES "
                "(9001, 'Fake 1', 'f1@x.test', 'lead'), (9002, 'Fake 2', 'f2@x.test', 'lead'), "
                "(9003, 'Fake 3', 'f3@x.test', 'lead')",
                "WITH doomed AS (DELETE FROM contacts WHERE id = 200 RETURNING id) "
                "SELECT count(*) FROM doomed",
                "DROP TABLE contacts CASCADE")]

        said = run_agent(recorder, token, script)
        assert not any(s.is_error for s in said[:5]) and said[5].is_error  # the drop waits for a person
        assert pg_rows(recorder_url, "SELECT count(*) FROM contacts") == [(CONTACTS - 25 + 3 - 1,)]
        run = Run.objects.get(agent__name="cleanup-bot")
        steps = {s.number: s for s in run.steps.all()}
        assert [steps[n].effect_summary for n in (2, 3, 4, 5)] == [
            "Updated 40 rows of public.contacts.", "Deleted 25 rows of public.contacts.",
            "Inserted 3 rows of public.contacts.", "Deleted 1 row of public.contacts."]
        with psycopg.connect(recorder_url, autocommit=True) as person:  # another role, afterwards
            person.execute("UPDATE contacts SET email = 'new5@example.com' WHERE id = 5")
            person.execute("UPDATE contacts SET status = 'customer' WHERE id = 7")

        plan = services.request_plan(run=run, requested_by=on_call, reason="bad cleanup", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        items = {i.step.number: i for i in plan.items.select_related("step")}
        assert items[2].check_detail["rows"] == {"restore": 39, "undone": 0, "conflict": 1}
        assert items[6].action == "nothing_to_undo"  # held, never sent
        for user in (approver_user, second_approver):
            approve(plan, user, enrolled(user), choices={str(items[2].position): "keep_newer"})
        plan = run_plan(plan)
        outcomes = {i.step.number: i.outcome for i in plan.items.select_related("step")}
        assert [outcomes[n] for n in (2, 3, 4, 5)] == ["compensated"] * 4
        expected = [(i, n, "new5@example.com" if i == 5 else e, "customer" if i == 7 else s, c)
                    for (i, n, e, s, c) in before]
        assert pg_rows(recorder_url, shape) == expected
        assert journal_services.verify_run(run=run).ok


def test_an_override_puts_back_the_rows_changed_since_only_where_they_still_read_as_the_approvers_saw_them(
        recorder, crm, admin_user, on_call, approver_user, second_approver):
    path, token = crm
    set_policy(admin_user)
    run_agent(recorder, token, lambda client: client.call_tool(
        "crm__write_query", {"query": "UPDATE contacts SET status = 'archived' WHERE id <= 3"}))
    with sqlite3.connect(path) as person:
        person.execute("UPDATE contacts SET status = 'customer' WHERE id IN (1, 2)")
    run = Run.objects.get(agent__name="cleanup-bot")
    plan = services.request_plan(run=run, requested_by=on_call, reason="undo it all", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    item = plan.items.get()
    assert item.check_detail["rows"] == {"restore": 1, "undone": 0, "conflict": 2}
    why = "The customers were marked by mistake too; the sales lead agreed."
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={str(item.position): "overwrite"},
                overrides={str(item.position): why})
    plan.refresh_from_db()
    signed = sentence.of_items(list(plan.items.select_related("step").order_by("position"))).text()
    assert "the 2 rows changed since by someone else, overwritten as the approvers chose" in \
        signed.split("It will not touch:")[0]
    with sqlite3.connect(path) as person:  # after the signatures: this row no longer reads as they saw it
        person.execute("UPDATE contacts SET status = 'vip' WHERE id = 2")
    plan = run_plan(plan)
    item.refresh_from_db()
    assert item.outcome == "compensated"
    assert rows(path, "SELECT id, status FROM contacts WHERE id <= 3") == [(1, "active"), (2, "vip"),
                                                                        (3, "lead")]
    assert item.outcome_detail["message"] == ("Put back 2 rows of contacts; 1 row changed since the check, "
                                              "left as it is.")
    assert item.outcome_detail["rows"]["changedSince"] == 1


def test_two_steps_that_changed_the_same_rows_are_undone_later_first_without_a_conflict(
        recorder, crm, admin_user, on_call, approver_user, second_approver):
    path, token = crm
    set_policy(admin_user)

    async def script(client):
        await client.call_tool("crm__write_query",
                               {"query": "UPDATE contacts SET status = 'a' WHERE id <= 2"})
        await client.call_tool("crm__write_query", {"query": "UPDATE contacts SET status = 'b' WHERE id = 1"})

    run_agent(recorder, token, script)
    run = Run.objects.get(agent__name="cleanup-bot")
    plan = services.request_plan(run=run, requested_by=on_call, reason="undo both", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    items = {i.step.number: i for i in plan.items.select_related("step")}
    assert items[2].position < items[1].position  # the later step is undone first
    assert (items[1].check_status, items[2].check_status) == ("ok", "ok")  # its own chain, not a conflict
    assert items[1].check_detail["chained"] == (
        "once the undos of the plan's later changes to the same rows have run")
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(plan)
    assert [i.outcome for i in plan.items.order_by("position")] == ["compensated", "compensated"]
    assert rows(path, "SELECT id, status FROM contacts WHERE id <= 2") == [(1, "active"), (2, "active")]
