"""Steps still in flight: a call its server turned into a task (the MCP tasks extension), and the steps a
stopped Recorder left open.

A task's call is journaled once: its intent as any call's, then a `task` entry when the server answers with
a task handle (the step stays in flight, its outcome unknown, under the server's task id), and its outcome
when an agent's `tasks/get` first sees the task end. The agent's `tasks/cancel` is journaled like any
cancel. A task nobody saw end is closed as unknown once its time to live is over.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from .. import ports
from ..models import Agent, Run, Step
from ..record import sql
from ..record.journaling import Outcome
from .record import append_entry, locked_run_by_id, save_moving
from .steps import OpenedStep, close_step, refuse_step

logger = logging.getLogger(__name__)

NEVER_SENT = ("The Recorder holding this call stopped (a restart or a crash) while it waited for approval: "
              "this attempt was never sent.")


@dataclass(frozen=True)
class RunningTask:
    """A journaled call whose server made it a task: the step to close when the task ends."""

    opened: OpenedStep
    started: datetime
    status: str  # the step's: `pending` while the task runs


def opened_again(step: Step) -> OpenedStep:
    """What closing `step` needs, read back from its row (the call that opened it is long gone)."""
    return OpenedStep(step_id=step.pk, run_id=step.run_id, number=step.number, server=step.server,
                      tool=step.tool, arguments=step.arguments, request_meta=step.request_meta,
                      kind=step.reversibility, source=step.declaration_source)


def task_started(*, opened: OpenedStep, task_id: str, status: str, ttl_ms: Any, now: datetime) -> bool:
    """The server answered the step's call with a task handle: the step stays in flight under the task's
    id until its end is seen, and the run's record says so (a `task` entry). False if the step was already
    closed (nothing changes)."""
    ttl = ttl_ms if isinstance(ttl_ms, int) and not isinstance(ttl_ms, bool) and ttl_ms >= 0 else None
    until = now + timedelta(milliseconds=ttl) if ttl is not None else None
    with transaction.atomic():
        run = locked_run_by_id(opened.run_id)
        followed = {"task_id": task_id, "task_until": until, "task_seen_at": now}
        if not sql.update(Step, opened.step_id, followed, only_if={"status": Step.Status.PENDING}):
            return False
        append_entry(run=run, event="task", now=now, data={
            "step": opened.number, "taskId": task_id, "status": status, **({"ttlMs": ttl} if ttl else {})})
        save_moving(run, now=now)
    return True


def task_followed(*, step_id: int, now: datetime, seen: datetime | None = None, adopt: bool = False) -> bool:
    """The process following the step's task looked at it now (False once the step is closed). `adopt`:
    take over following it from a process that stopped marking it (last marked at `seen`): True for exactly
    one of the processes that try."""
    found = Step.objects.filter(pk=step_id, status=Step.Status.PENDING)
    if adopt:
        found = found.filter(task_seen_at=seen)
    return bool(found.update(task_seen_at=now))


def running_task(*, agent: Agent, server_name: str, task_id: str) -> RunningTask | None:
    """The step of `agent`'s call that `server_name` made the task `task_id`, or None: another agent's
    task is as unknown as one that never was."""
    step = (Step.objects.filter(task_id=task_id, server_name=server_name, run__agent=agent)
            .select_related("server").order_by("-pk").first())
    if step is None:
        return None
    return RunningTask(opened=opened_again(step), started=step.started_at, status=step.status)


def task_cancelled(*, task: RunningTask, now: datetime) -> None:
    """The agent asked the server to cancel the task: journaled as the agent's cancel (what became of the
    task is its outcome, when seen)."""
    with transaction.atomic():
        run = locked_run_by_id(task.opened.run_id)
        task_id = Step.objects.filter(pk=task.opened.step_id).values_list("task_id", flat=True).first()
        append_entry(run=run, event="task_cancel", now=now, data={"step": task.opened.number,
                                                                   "taskId": task_id or ""})
        save_moving(run, now=now)


def reconcile_stale_steps(*, older_than: datetime, now: datetime | None = None) -> int:
    """Close steps still `pending` long after any call could have lasted: the Recorder stopped (or its
    database failed) between forwarding a call and recording the answer. The server may have acted, so the
    step becomes a failed call whose outcome is unknown, never a silent gap in the record. A step still
    `held` that its process stopped marking (`ports.HOLD_LOST_SECONDS`) has nobody waiting on it: it was
    never forwarded, and is closed as such (its held call stays as it is: an approval lets the agent's next
    identical call through). That is true by construction: an approval is claimed only together with
    releasing a step that is still held (`release_held_step`), so once closed here the step is never sent.
    A task's step waits for its task's time to live (and one without a limit for good): the task may still
    be at work."""
    now = now or timezone.now()
    closed = 0
    # An imported run's record is not ours to close.
    local = Step.objects.exclude(run__state=Run.State.IMPORTED)
    lost = local.filter(status=Step.Status.HELD).annotate(seen=Coalesce("held_seen_at", "started_at")).filter(
        seen__lt=now - timedelta(seconds=ports.HOLD_LOST_SECONDS))
    for step in lost.iterator():
        opened = OpenedStep(step_id=step.pk, run_id=step.run_id, number=step.number)
        closed += _one_by_one(step, lambda opened=opened: refuse_step(
            opened=opened, now=now, message=NEVER_SENT, held_end=ports.HeldEnd.LOST))
    running = Q(task_id__gt="") & (Q(task_until__isnull=True) | Q(task_until__gt=now))
    stale = (local.filter(status=Step.Status.PENDING, started_at__lt=older_than).exclude(running)
             .select_related("server"))
    for step in stale.iterator():
        message = (f"Nobody saw the end of {step.server_name}'s task {step.task_id} before its time to live "
                   "ran out; it may have acted." if step.task_id else
                   "The Recorder stopped before the tool server's answer was recorded.")
        # close_step closes only a step that is still pending, so a real answer recorded a moment ago wins.
        closed += _one_by_one(step, lambda step=step, message=message: close_step(
            opened=opened_again(step), started=step.started_at, finished=now, outcome=Outcome(
                error_message=message, failure_class=Step.FailureClass.UNKNOWN, may_have_acted=True)))
    return closed


def _one_by_one(step: Step, close) -> int:
    """Close one stale step (1 if it was closed here). A step that cannot be closed is logged and left for
    the next round: one bad row must never keep the reconciler from every step after it."""
    try:
        return 1 if close() else 0
    except Exception:
        logger.exception("could not close stale step %s of run %s; the next round tries again", step.number,
                         step.run_id)
        return 0
