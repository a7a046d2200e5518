"""A 20-item plan executed while the worker process is killed with SIGKILL at random moments.

The calendar's ledger, not our database, decides: every meeting cancelled exactly once (none twice, none
lost), and in reverse order of booking. FAULT_RUNS sets how many plans (CI runs a quick size; the full size
is `FAULT_RUNS=20 make test`-style, or bench/faults.py).
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from django.utils import timezone

from approver import services, tasks
from approver.models import Plan
from journal import services as journal_services
from journal.models import Run
from tests.approver.services.test_approvals import approve, enrolled
from tests.journal.helpers import register_samples, run_agent, settle
from tests.services import worker_env_for_test_database

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ITEMS = 20
RUNS = int(os.environ.get("FAULT_RUNS", "2"))


def start_worker():
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "approver", "worker", "--pool=solo", "--loglevel=ERROR",
         f"--hostname=faults-{time.monotonic_ns()}@%h"],
        env=worker_env_for_test_database(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_until_working(plan, worker, timeout: float = 30.0) -> None:
    """Until the started worker claims an item, or the plan has finished, or the worker died."""
    done = plan.items.filter(exec_state="done").count()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.poll() is None:
        items = plan.items.all()
        if (items.filter(exec_state="running").exists() or items.filter(exec_state="done").count() > done
                or Plan.objects.get(pk=plan.pk).state not in ("approved", "executing")):
            return
        time.sleep(0.05)


def ledger_figures(sample_servers, plan) -> tuple[int, int, int]:
    """From the calendar's own ledger: (compensations applied twice, lost, consecutive pairs not in
    reverse order) for this plan, whose idempotency keys name the step."""
    cancelled = [e for e in sample_servers.ledger("calendar") if e["op"] == "compensate"
                 and e.get("idempotencyKey", "").startswith(f"undo:{plan.public_id}:")]
    steps = [int(e["idempotencyKey"].split(":")[2]) for e in cancelled]
    return (len(steps) - len(set(steps)), ITEMS - len(set(steps)),
            sum(1 for a, b in zip(steps, steps[1:], strict=False) if a <= b))


def book_meetings(recorder, token, key: str) -> None:
    async def script(client):
        for n in range(ITEMS):
            await client.call_tool(
                "calendar__create_event",
                {
                    "title": f"{key} meeting {n}",
                    "start": "2026-12-04T15:00:00+00:00",
                    "attendees": ["a@acme.example"],
                },
                meta={"hatp/journal": {"runId": key}},
            )

    run_agent(recorder, token, script)


def test_sigkill_at_random_moments_never_loses_or_repeats_a_compensation(
        recorder, sample_servers, dana, on_call, approver_user, second_approver, settings):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    register_samples(sample_servers, names=("calendar",))
    _, token = journal_services.create_agent(name="booking-bot", on_behalf_of=dana)
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    rng = random.Random(20261129)
    kills = mid_plan = in_flight = twice = lost = out_of_order = 0
    for attempt in range(RUNS):
        key = f"faults-{attempt}"
        book_meetings(recorder, token, key)
        settle(recorder)
        run = Run.objects.get(key=f"run:{key}")
        plan = services.request_plan(run=run, requested_by=on_call, reason="faults", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        approve(plan, approver_user, ana, choices={})
        approve(plan, second_approver, bo, choices={})
        plan.refresh_from_db()
        assert plan.state == "approved"
        sample_servers.set_mode("calendar", "normal", delay_ms=150)

        deadline = time.monotonic() + 120
        while Plan.objects.get(pk=plan.pk).state in ("approved", "executing"):
            assert time.monotonic() < deadline, "the plan did not finish"
            worker = start_worker()
            tasks.execute_plan.delay(plan.pk)
            # The kill lands at a random moment of the worker's work, however long its start took.
            wait_until_working(plan, worker)
            time.sleep(rng.uniform(0.0, 1.2))
            if worker.poll() is None:
                # An item claimed and not yet recorded: its compensation was (or was about to be) sent and
                # its outcome is not on the record, the window a kill between a call and its record hits.
                calling = plan.items.filter(exec_state="running").exists()
                worker.send_signal(signal.SIGKILL)
                kills += 1
                in_flight += calling
                done = plan.items.filter(exec_state="done").count()
                mid_plan += 0 < done < ITEMS
            worker.wait(timeout=20)
            # What the dead worker left running is picked up, as the periodic reconciler would.
            services.reconcile_execution(older_than=timezone.now())
        sample_servers.set_mode("calendar", "normal")

        plan.refresh_from_db()
        figures = ledger_figures(sample_servers, plan)
        twice, lost, out_of_order = (a + b for a, b in zip((twice, lost, out_of_order), figures, strict=True))
        assert plan.state == "completed", (plan.state, plan.stop_reason, plan.execution_summary)
    print(f"\nkilled-worker faults: {RUNS} plans of {ITEMS} items, {kills} SIGKILLs ({mid_plan} mid-plan, "
          f"{in_flight} between a compensation's claim and its record): {twice} compensations applied twice, "
          f"{lost} lost, {out_of_order} pairs out of reverse order")
    assert (twice, lost, out_of_order) == (0, 0, 0)
    assert mid_plan >= RUNS  # the kills really landed while plans ran
