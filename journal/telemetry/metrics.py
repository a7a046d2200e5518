"""The product's Prometheus metrics, counted in whichever process does the work: the Recorder's calls and
journal, the worker's checks and compensations, the audit stream's deliveries.

Several uvicorn and Celery processes count into one directory (`METRICS_DIR`, prometheus-client's
multiprocess mode): each process writes its own memory-mapped file, and `/metrics` sums them as it is
scraped. A process's counters outlive it there (a counter must never go down); a gauge of a process that no
longer runs is dropped as `/metrics` is read (`forget_dead`). With `METRICS=off` nothing is written and
`/metrics` answers 404.

What is a state rather than an event (held calls waiting, plans by state, leases, unknown outcomes, the
worker's queue, the audit stream's lag) is read from the database as `/metrics` is scraped
(`approver.observed`), so every process reports the same truth and nothing drifts.
"""

import contextlib
import glob
import os
import re

from django.conf import settings
from django.db import transaction
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

ON = bool(settings.METRICS)
DIRECTORY = str(settings.METRICS_DIR) if ON else ""
if ON:
    os.makedirs(DIRECTORY, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = DIRECTORY  # read by the values below as each is made
    values.ValueClass = values.MultiProcessValue()

# How an agent's call ended, as the agent heard it (`calls.outcome_of`).
OUTCOMES = ("ok", "tool_error", "jsonrpc_error", "timeout", "failed", "refused", "held", "cancelled",
            "not_relayed", "task")
DECISIONS = ("allow", "ask", "deny", "none")  # "none": refused before any policy was asked

TOOL_CALLS = Counter(
    "undo_tool_calls", "Agents' tools/call requests through the Recorder, by server, tool, how the Recorder "
    "answered (ok, tool_error, jsonrpc_error, timeout, failed, refused, held, cancelled, not_relayed, task) "
    "and the autonomy policy's decision (allow, ask, deny; none when refused before a policy was asked).",
    ["server", "tool", "outcome", "decision"])
ANSWERS_LOST = Counter(
    "undo_tool_answers_lost", "Answers that never reached the agent (it went away after the server had the "
    "call), by server: each call is counted by its outcome too.", ["server"])
TOOL_CALL_SECONDS = Histogram(
    "undo_tool_call_duration_seconds", "A tools/call from the agent's request to its journaled answer, by "
    "server.", ["server"], buckets=(.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
JOURNAL_COMMIT_SECONDS = Histogram(
    "undo_journal_commit_seconds", "One journal group (every write waiting at that moment) from its first "
    "statement to its commit.", buckets=(.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5))
JOURNAL_GROUP_SIZE = Histogram(
    "undo_journal_group_size", "Journal writes committed together in one group.",
    buckets=(1, 2, 4, 8, 16, 32, 64))
JOURNAL_QUEUE = Gauge(
    "undo_journal_queue_depth", "Journal writes waiting for the journal thread, summed over the Recorder "
    "processes.", multiprocess_mode="livesum")
ROWS_MISREAD = Counter(
    "undo_database_rows_misread", "Rows a database's capture kept for SQL calls whose statements read as "
    "reads (the record says what the rows say, and flags the call), by server.", ["server"])
ROWS_UNRECORDED = Counter(
    "undo_database_rows_unrecorded", "Rows a database's capture kept that no recorded call's window holds "
    "(changed by no recorded call), found by the capture's sweep, by server.", ["server"])
CHECKS = Counter("undo_checks", "Checks of plan items against their tool servers, by result (ok, "
                 "conflict, expired, unavailable, error).", ["result"])
COMPENSATIONS = Counter(
    "undo_compensations", "Plan items the executor finished, by outcome (compensated, compensation_failed, "
    "conflict, skipped, irreversible, no_compensation, outcome_unknown).", ["outcome"])
AUDIT_DELIVERED = Counter("undo_audit_events_delivered", "Audit events delivered, by sink.", ["sink"])
AUDIT_FAILURES = Counter("undo_audit_delivery_failures", "Audit deliveries that failed (and will be tried "
                         "again), by sink.", ["sink"])


def counted(counter: Counter, label: str, amount: int = 1) -> None:
    """Count `amount` under `label` once the transaction around commits: what is rolled back (or tried
    again after a kill) is not counted twice."""
    if amount:
        transaction.on_commit(lambda: counter.labels(label).inc(amount))


def registry_now() -> CollectorRegistry:
    """Every process's counts, summed, in a registry of their own (prometheus-client's multiprocess
    collector), for one scrape."""
    registry = CollectorRegistry()
    if ON:
        forget_dead()
        multiprocess.MultiProcessCollector(registry, path=DIRECTORY)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


_PID = re.compile(r"_(\d+)\.db$")


def forget_dead() -> None:
    """Drop the live gauges of processes on this host that no longer run (killed, or stopped without
    saying so): a queue depth must not count a process that is gone."""
    for path in glob.glob(os.path.join(DIRECTORY, "gauge_live*_*.db")):
        match = _PID.search(path)
        if match and not _running(int(match.group(1))):
            multiprocess.mark_process_dead(int(match.group(1)), DIRECTORY)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_ended() -> None:
    """This process is stopping: its live gauges go with it."""
    if ON:
        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(os.getpid(), DIRECTORY)
