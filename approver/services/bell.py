"""The one doorbell: how the approval side asks the worker to do something.

The database row is the record and Celery only rings the bell (STYLE.md rule 5). The bell rings once the
current transaction commits (at once outside one), so a worker never looks before the row is there. A broker
that is down must not turn a committed change into an error for whoever caused it (an agent's held call, an
approver's signature, an on-call request): the failure is logged, and the periodic tasks ring again for
whatever is left waiting (stalled checks, plans nobody took, approvers never told).

Tasks are rung by their registered name, through the current Celery app, so nothing here imports the task
modules (which call the services).
"""

import functools
import logging

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

DRAFT_PLAN = "approver.draft_plan"
CHECK_PLAN = "approver.check_plan"
EXECUTE_PLAN = "approver.execute_plan"
NOTIFY_PLAN_READY = "approver.notify_plan_ready"
NOTIFY_PLAN_DECIDED = "approver.notify_plan_decided"
NOTIFY_PLAN_EXECUTED = "approver.notify_plan_executed"
NOTIFY_ACTION_REQUESTED = "approver.notify_action_requested"
RETRY_NOTICE = "approver.retry_notice"
DELIVER_WEBHOOK = "approver.deliver_webhook"


def ring(task: str, *args, countdown: float | None = None) -> None:
    """Ask the worker to run `task(*args)` once the current transaction commits (`countdown` seconds later,
    if given)."""
    transaction.on_commit(functools.partial(_ring_now, task, args, countdown))


def _ring_now(task: str, args: tuple, countdown: float | None) -> None:
    try:
        bell = current_app.tasks[task]
        if countdown is None:
            bell.delay(*args)
        else:
            bell.apply_async(args, countdown=max(countdown, 0.0))
    except Exception:
        logger.exception("could not ring the worker for %s%s; the periodic tasks will", task, args)
