"""What `/metrics` reads from the database as it is scraped: the states on-call watches (held calls waiting
and how long, plans by state, unknown outcomes waiting to be settled, record leases held and waited on) and
the worker's queue. Read at each scrape, from the same rows the pages show, so every process reports the
same figures and none can drift from the truth. Counted events (calls, checks, compensations, the journal's
commits) are `journal.telemetry.metrics`'."""

import logging

from django.db import DatabaseError
from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from journal.audit import lag as audit_lag

from . import execution
from .celery import app as celery_app
from .models import ActionRequest, Plan, PlanItem, RecordLease

logger = logging.getLogger(__name__)

QUEUES = ("celery",)


class States:
    """A prometheus-client collector of the database's states (register it in a scrape's registry)."""

    def collect(self):
        """Each state, and `undo_states_readable` (0 when the database could not be read: the counts above
        it still go out)."""
        try:
            yield from self._states(timezone.now())
        except DatabaseError as exc:
            logger.warning("metrics: the database's states could not be read: %s", exc)
            yield GaugeMetricFamily("undo_states_readable", "Whether the database's states could be read.",
                                    value=0)
        else:
            yield GaugeMetricFamily("undo_states_readable", "Whether the database's states could be read.",
                                    value=1)

    def _states(self, now):
        waiting = ActionRequest.objects.filter(state=ActionRequest.State.PENDING, expires_at__gt=now)
        found = waiting.aggregate(count=Count("id"), oldest=Min("created_at"))
        yield GaugeMetricFamily("undo_held_calls_waiting", "Held calls waiting for approvers' decision.",
                                value=found["count"])
        yield GaugeMetricFamily(
            "undo_held_call_oldest_wait_seconds", "How long the oldest held call still waiting has waited.",
            value=(now - found["oldest"]).total_seconds() if found["oldest"] else 0)
        plans = GaugeMetricFamily("undo_plans", "Reversal plans by state.", labels=["state"])
        counts = dict(Plan.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
        for state in Plan.State.values:
            plans.add_metric([state], counts.get(state, 0))
        yield plans
        yield GaugeMetricFamily(
            "undo_unknown_outcomes_waiting", "Compensations whose outcome nobody knows (the server may have "
            "acted without answering), waiting for a person to settle them.",
            value=PlanItem.objects.filter(outcome=execution.OUTCOME_UNKNOWN,
                                          exec_state=PlanItem.Exec.DONE).count())
        leases = RecordLease.objects.open().aggregate(
            held=Count("id", filter=_held()), waiting=Count("id", filter=~_held()))
        yield GaugeMetricFamily("undo_leases_held", "Records a plan holds a lease on.", value=leases["held"])
        yield GaugeMetricFamily("undo_leases_waiting", "Plans' items waiting for another plan's lease.",
                                value=leases["waiting"])
        depth = GaugeMetricFamily("undo_worker_queue_depth", "Tasks waiting in the worker's queue.",
                                  labels=["queue"])
        for queue in QUEUES:
            size = queue_depth(queue)
            if size is not None:
                depth.add_metric([queue], size)
        yield depth
        yield from audit_lag.families(now)


def _held() -> Q:
    return Q(held_since__isnull=False)


def queue_depth(queue: str) -> int | None:
    """Tasks waiting in `queue` on the broker (Redis, or the embedded one), or None when it cannot be read."""
    try:
        with celery_app.connection_for_read() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
            try:
                return connection.default_channel.queue_declare(queue=queue, passive=True).message_count
            except connection.channel_errors:  # no queue yet: nothing was ever put on it
                return 0
    except Exception as exc:  # the scrape reports what it can
        logger.warning("metrics: the worker's queue %s could not be read: %s", queue, exc)
        return None
