"""A database undo of 10,000 rows, its worker killed with SIGKILL at random moments until it finishes: the
capture, not our record, decides. Every row is put back exactly once (on SQLite the undo's own writes are
captured too: each row shows one restore, none twice, none missing), and the undo's marker is there once."""

import random
import signal
import time

import pytest
from django.utils import timezone

from approver import services, tasks
from journal import services as journal_services
from journal.models import Run
from tests.approver.services.test_approvals import approve, enrolled
from tests.journal.helpers import run_agent
from tests.journal.undo.databases import rows, sqlite_crm
from tests.services import needs_sqlite_server

from .test_killed_worker import runnable, start_worker, wait_until_working

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True), needs_sqlite_server]

ROWS = 10_000
KILLS = 4


def test_sigkill_in_the_middle_of_a_10000_row_undo_puts_every_row_back_exactly_once(
        recorder, tmp_path, admin_user, dana, on_call, approver_user, second_approver, settings):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    path = tmp_path / "crm.db"
    sqlite_crm(path, by=admin_user, contacts=ROWS)
    token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
    before = rows(path, "SELECT id, status FROM contacts ORDER BY id")
    run_agent(recorder, token, lambda client: client.call_tool(
        "crm__write_query", {"query": "UPDATE contacts SET status = 'archived'"}))
    agent_last = rows(path, "SELECT max(id) FROM _undo_capture_changes")[0][0]
    run = Run.objects.get(agent__name="cleanup-bot")
    plan = services.request_plan(run=run, requested_by=on_call, reason="faults", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.items.get().check_detail["rows"] == {"restore": ROWS, "undone": 0, "conflict": 0}
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    rng, kills, mid_transaction = random.Random(20261206), 0, 0
    deadline = time.monotonic() + 300
    while runnable(plan):
        assert time.monotonic() < deadline, "the plan did not finish"
        worker = start_worker()
        tasks.execute_plan.delay(plan.pk)
        wait_until_working(plan, worker)
        if kills < KILLS:
            time.sleep(rng.uniform(0.0, 0.12))  # the 10,000 rows take 0.15 to 0.5 s, by the machine's load
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=20)
                kills += 1
                mid_transaction += bool(plan.items.filter(exec_state="running").exists())
        else:  # enough: this one finishes the plan
            while runnable(plan) and worker.poll() is None:
                time.sleep(0.1)
            worker.kill()
            worker.wait(timeout=20)
        services.reconcile_execution(older_than=timezone.now())
    plan.refresh_from_db()
    item = plan.items.get()
    assert (plan.state, item.outcome) == ("completed", "compensated"), (plan.state, item.outcome_detail)
    assert rows(path, "SELECT id, status FROM contacts ORDER BY id") == before
    restores = rows(path, "SELECT pk, count(*) FROM _undo_capture_changes WHERE id > ? GROUP BY pk",
                    agent_last)
    twice = sum(1 for _, n in restores if n > 1)
    lost = ROWS - len(restores)
    print(f"\nkilled-worker database undo: {ROWS} rows, {kills} SIGKILLs ({mid_transaction} with the item "
          f"claimed): {twice} rows put back twice, {lost} lost")
    assert (twice, lost) == (0, 0)
    assert rows(path, "SELECT count(*) FROM _undo_capture_applied") == [(1,)]
    assert kills >= 1 and mid_transaction >= 1
