"""A plan executed on the Redis broker while Redis is killed and restarted mid-plan: the worker reconnects,
and the calendar's ledger shows every meeting cancelled exactly once, in reverse order."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from celery import Celery
from django.utils import timezone

from approver import services
from approver.models import Plan
from journal import services as journal_services
from journal.models import Run
from tests.approver.services.test_approvals import approve, enrolled
from tests.conftest import free_port
from tests.faults.test_killed_worker import ITEMS, book_meetings, ledger_figures
from tests.journal.helpers import register_samples, settle
from tests.services import REQUIRED, worker_env_for_test_database

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not REQUIRED and not shutil.which("redis-server"), reason="redis-server is not installed here"
    ),
]
RUNS = int(os.environ.get("FAULT_RUNS", "2"))


def redis(port: int, folder) -> subprocess.Popen:
    process = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                                "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while (
        subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG"
    ):
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.1)
    return process


def test_restarting_redis_mid_plan_loses_and_repeats_nothing(
        recorder, sample_servers, dana, on_call, approver_user, second_approver, settings, tmp_path):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    register_samples(sample_servers, names=("calendar",))
    _, token = journal_services.create_agent(name="booking-bot", on_behalf_of=dana)
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    port = free_port()
    url = f"redis://localhost:{port}/0"
    # The test rings through Redis, as the web app would with REDIS_URL set; not as the current app, which
    # would take over every shared task of the tests that follow.
    bell = Celery(broker=url, set_as_current=False)
    twice = lost = out_of_order = restarts = mid_plan = 0
    server = redis(port, tmp_path)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "approver", "worker", "--pool=solo", "--loglevel=ERROR",
         "--hostname=redis-faults@%h"], env={**worker_env_for_test_database(), "REDIS_URL": url},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for attempt in range(RUNS):
            key = f"redis-{attempt}"
            book_meetings(recorder, token, key)
            settle(recorder)
            plan = services.request_plan(run=Run.objects.get(key=f"run:{key}"), requested_by=on_call,
                                         reason="faults", from_step=1)
            plan = services.run_checks(plan=plan, check_round=plan.check_round)
            approve(plan, approver_user, ana, choices={})
            approve(plan, second_approver, bo, choices={})
            sample_servers.set_mode("calendar", "normal", delay_ms=150)
            bell.send_task("approver.execute_plan", args=[plan.pk])
            under_way = time.monotonic() + 30
            while not plan.items.filter(exec_state="done").exists() and time.monotonic() < under_way:
                time.sleep(0.05)
            time.sleep(0.5)  # the plan is under way
            done = plan.items.filter(exec_state="done").count()
            mid_plan += 0 < done < ITEMS
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=10)
            time.sleep(1.0)
            server = redis(port, tmp_path)
            restarts += 1
            deadline = time.monotonic() + 120
            while Plan.objects.get(pk=plan.pk).state in ("approved", "executing"):
                assert time.monotonic() < deadline, "the plan did not finish"
                time.sleep(3.0)
                # A message Redis lost with its memory is rung again, as the periodic reconciler would.
                services.reconcile_execution(older_than=timezone.now() - timezone.timedelta(seconds=2))
                bell.send_task("approver.execute_plan", args=[plan.pk])
            sample_servers.set_mode("calendar", "normal")
            plan.refresh_from_db()
            figures = ledger_figures(sample_servers, plan)
            twice, lost, out_of_order = (
                a + b for a, b in zip((twice, lost, out_of_order), figures, strict=True)
            )
            assert plan.state == "completed", (plan.state, plan.stop_reason, plan.execution_summary)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=20)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
    print(
        f"\nredis-restart faults: {RUNS} plans of {ITEMS} items, Redis restarted {restarts} times "
        f"({mid_plan} mid-plan): "
        f"{twice} compensations applied twice, {lost} lost, {out_of_order} pairs out of reverse order"
    )
    assert (twice, lost, out_of_order) == (0, 0, 0)
    assert mid_plan >= 1  # the restarts really landed while plans ran
