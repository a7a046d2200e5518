"""A 20-item plan executed while the worker is killed with SIGKILL at random moments: the whole worker (solo
pool), or a prefork pool's child while its parent lives on and forks another.

The calendar's ledger, not our database, decides: every meeting cancelled exactly once (none twice, none
lost), and in reverse order of booking. FAULT_RUNS sets how many plans (CI runs a quick size; the full size
is `FAULT_RUNS=20 make test`-style, or bench/faults.py).
"""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def start_worker(pool: str = "solo"):
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "approver", "worker", f"--pool={pool}", "--concurrency=1",
         "--loglevel=ERROR", f"--hostname=faults-{time.monotonic_ns()}@%h"],
        env=worker_env_for_test_database(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stat(path: Path) -> list[str] | None:
    """A process's state, parent and the rest, from its /proc/<pid>/stat; None once it is gone."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (a prefork worker's pool), from /proc."""
    return [int(path.parent.name) for path in Path("/proc").glob("[0-9]*/stat")
            if (fields := _stat(path)) and int(fields[1]) == pid and fields[0] != "Z"]


def kill_and_wait(pids: list[int], timeout: float = 20.0) -> None:
    """SIGKILL each of `pids` and wait until none runs (a zombie, dead and not yet reaped, does not)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any((fields := _stat(Path(f"/proc/{pid}/stat"))) and fields[0] != "Z" for pid in pids):
        assert time.monotonic() < deadline, f"one of {pids} outlived SIGKILL"
        time.sleep(0.01)


def stop_with_its_pool(worker) -> None:
    """Kill a prefork worker and its pool: a child outliving its parent would keep its database session."""
    pool = children(worker.pid)
    worker.kill()
    worker.wait(timeout=20)
    kill_and_wait(pool)


def pool_child(worker, timeout: float = 30.0) -> int:
    """The one child of a prefork worker started with --concurrency=1, once its parent has forked it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.poll() is None, "the prefork worker's parent died"
        if kids := children(worker.pid):
            return kids[0]
        time.sleep(0.02)
    raise AssertionError("the prefork worker forked no child")


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


class Kills:
    """What the kills hit, read after each kill from our record and the calendar's ledger (a dead process
    writes neither again)."""

    def __init__(self):
        self.kills = self.mid_plan = self.claimed = self.called = 0

    def landed(self, plan, sample_servers) -> None:
        self.kills += 1
        done = plan.items.filter(exec_state="done").count()
        self.mid_plan += 0 < done < ITEMS
        # An item claimed and not yet recorded; when the calendar already holds its key, the compensation
        # was made and only its record is missing: the kill fell between the call and the record.
        running = set(plan.items.filter(exec_state="running").values_list("idempotency_key", flat=True))
        applied = {entry.get("idempotencyKey") for entry in sample_servers.ledger("calendar")
                   if entry["op"] == "compensate"}
        self.claimed += bool(running)
        self.called += bool(running & applied)

    def __str__(self) -> str:
        return (f"{self.kills} SIGKILLs ({self.mid_plan} mid-plan, {self.claimed} between a compensation's "
                f"claim and its record, {self.called} of them between its call and its record)")


def approved_plan(recorder, token, key, on_call, approvers):
    """A plan to cancel the 20 meetings an agent booked under run `key`, approved by both approvers."""
    book_meetings(recorder, token, key)
    settle(recorder)
    run = Run.objects.get(key=f"run:{key}")
    plan = services.request_plan(run=run, requested_by=on_call, reason="faults", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user, device in approvers:
        approve(plan, user, device, choices={})
    plan.refresh_from_db()
    assert plan.state == "approved"
    return plan


def runnable(plan) -> bool:
    return Plan.objects.get(pk=plan.pk).state in ("approved", "executing")


@pytest.fixture
def faults_setup(sample_servers, dana, approver_user, second_approver, settings):
    """The calendar registered, an agent's token, and the two approvers with their keys."""
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    register_samples(sample_servers, names=("calendar",))
    _, token = journal_services.create_agent(name="booking-bot", on_behalf_of=dana)
    yield token, [(approver_user, enrolled(approver_user)), (second_approver, enrolled(second_approver))]
    sample_servers.set_mode("calendar", "normal")


def finish(plan, sample_servers, figures: list[int]) -> None:
    plan.refresh_from_db()
    assert plan.state == "completed", (plan.state, plan.stop_reason, plan.execution_summary)
    for n, figure in enumerate(ledger_figures(sample_servers, plan)):
        figures[n] += figure


def test_sigkill_at_random_moments_never_loses_or_repeats_a_compensation(
        recorder, sample_servers, on_call, faults_setup):
    token, approvers = faults_setup
    rng = random.Random(20261129)
    kills, figures = Kills(), [0, 0, 0]
    for attempt in range(RUNS):
        plan = approved_plan(recorder, token, f"faults-{attempt}", on_call, approvers)
        sample_servers.set_mode("calendar", "normal", delay_ms=150)
        deadline = time.monotonic() + 120
        while runnable(plan):
            assert time.monotonic() < deadline, "the plan did not finish"
            worker = start_worker()
            tasks.execute_plan.delay(plan.pk)
            # The kill lands at a random moment of the worker's work, however long its start took.
            wait_until_working(plan, worker)
            time.sleep(rng.uniform(0.0, 1.2))
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=20)
                kills.landed(plan, sample_servers)
            else:
                worker.wait(timeout=20)
            # What the dead worker left running is picked up, as the periodic reconciler would.
            services.reconcile_execution(older_than=timezone.now())
        finish(plan, sample_servers, figures)
    twice, lost, out_of_order = figures
    print(f"\nkilled-worker faults: {RUNS} plans of {ITEMS} items, {kills}: {twice} compensations applied "
          f"twice, {lost} lost, {out_of_order} pairs out of reverse order")
    assert (twice, lost, out_of_order) == (0, 0, 0)
    assert kills.mid_plan >= RUNS  # the kills really landed while plans ran


@pytest.mark.postgres  # on PostgreSQL too, where a killed child leaves a connection the server must end
def test_sigkill_of_the_pool_child_never_loses_or_repeats_a_compensation(
        recorder, sample_servers, on_call, faults_setup):
    """A prefork worker whose child is killed while its parent lives: Celery rejects the lost task back to
    the queue (acks late, reject on worker lost) and forks a new child. The calendar holds each answer for
    a while after acting, so most kills fall between a compensation's call and its record."""
    token, approvers = faults_setup
    rng = random.Random(20261205)
    kills, figures = Kills(), [0, 0, 0]
    worker = start_worker(pool="prefork")
    try:
        for attempt in range(RUNS):
            plan = approved_plan(recorder, token, f"pool-faults-{attempt}", on_call, approvers)
            sample_servers.set_mode("calendar", "normal", answer_delay_ms=150)
            tasks.execute_plan.delay(plan.pk)
            deadline = time.monotonic() + 120
            while runnable(plan):
                assert time.monotonic() < deadline, "the plan did not finish"
                child = pool_child(worker)
                wait_until_working(plan, worker)
                time.sleep(rng.uniform(0.0, 1.0))
                if not runnable(plan):
                    break
                kill_and_wait([child])
                kills.landed(plan, sample_servers)
                # The parent sends the lost task back to the queue by itself; what the child left running
                # is picked up as the periodic reconciler would, and rung again.
                services.reconcile_execution(older_than=timezone.now())
                tasks.execute_plan.delay(plan.pk)
            finish(plan, sample_servers, figures)
        assert worker.poll() is None, "the prefork worker's parent died with its child"
    finally:
        stop_with_its_pool(worker)
    twice, lost, out_of_order = figures
    print(f"\nkilled-pool-child faults: {RUNS} plans of {ITEMS} items, {kills}: {twice} compensations "
          f"applied twice, {lost} lost, {out_of_order} pairs out of reverse order")
    assert (twice, lost, out_of_order) == (0, 0, 0)
    assert kills.mid_plan >= RUNS
