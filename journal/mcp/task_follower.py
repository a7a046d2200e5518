"""The Recorder follows every task a server made of an agent's call to its end itself, so the outcome is
journaled whether or not the agent ever asks (`tasks/get`): it polls the server with a growing pause, within
the task's time to live, and journals the end the first time it is seen, by it or by the agent's own
`tasks/get` (closing a step is a conditional update: whoever sees the end first journals it, once).

A Recorder that starts again picks up every task still in flight (a restart, a crash, another process's
task): each process follows them all, which costs some duplicate polling and never a duplicate outcome. A
task whose time to live runs out unseen is closed by the reconciler as unknown (the server may have acted)."""

import asyncio
import contextlib
import logging
from datetime import datetime

from asgiref.sync import sync_to_async
from django.utils import timezone

from .. import services
from ..models import Step
from ..upstream.client import ToolServerError, Upstreams, endpoint_of
from .journal_thread import JournalThread

logger = logging.getLogger(__name__)

FIRST_PAUSE = 1.0  # seconds before the first look: most tasks are not done at once
LONGEST_PAUSE = 15.0  # the pause doubles up to this
GIVE_UP_AFTER = 20  # consecutive failed looks (the server down for minutes): the reconciler takes over


class TaskFollower:
    """The tasks this Recorder follows, one asyncio task each, by step."""

    def __init__(self, journal: JournalThread, upstreams: Upstreams, outcome_of):
        self.journal, self.upstreams = journal, upstreams
        self.outcome_of = outcome_of  # (opened step, tasks/get answer) -> services.Outcome
        self.following: dict[int, asyncio.Task] = {}

    def follow(self, task: services.RunningTask, task_id: str, until: datetime | None, owner) -> None:
        """Follow the task `task_id` of the step `task.opened` to its end (at most until `until`)."""
        step_id = task.opened.step_id
        if step_id in self.following or task.opened.server is None:
            return
        self.following[step_id] = asyncio.get_running_loop().create_task(
            self._follow(task, task_id, until, owner), name=f"follow task of step {step_id}")
        self.following[step_id].add_done_callback(lambda _: self.following.pop(step_id, None))

    async def resume(self) -> int:
        """Follow every task still in flight, as the record has them (after a restart, or another
        process's); how many."""
        rows = await sync_to_async(_in_flight)(timezone.now())
        for step, owner in rows:
            self.follow(services.RunningTask(opened=services.opened_again(step), started=step.started_at,
                                             status=step.status), step.task_id, step.task_until, owner)
        return len(rows)

    async def close(self) -> None:
        for following in list(self.following.values()):
            following.cancel()
        for following in list(self.following.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await following

    async def _follow(self, task: services.RunningTask, task_id: str, until: datetime | None, owner) -> None:
        opened, pause, failures = task.opened, FIRST_PAUSE, 0
        endpoint = endpoint_of(opened.server)
        while True:
            await asyncio.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
            if until is not None and timezone.now() >= until:
                return  # its time to live is over: the reconciler closes it as unknown
            if not await sync_to_async(_still_pending)(opened.step_id):
                return  # the agent's own tasks/get saw the end (or the reconciler closed it)
            try:
                answer = await self.upstreams.task_request(endpoint, "tasks/get", {"taskId": task_id},
                                                           owner=owner)
            except ToolServerError as exc:
                failures += 1
                if exc.code is not None or failures >= GIVE_UP_AFTER:  # the server says no such task
                    logger.warning("stopped following task %s of step %s: %s", task_id, opened.step_id,
                                   exc.message)
                    return
                continue
            failures = 0
            if answer.get("status") in ("completed", "failed", "cancelled"):
                await self.journal.run(services.close_step, opened=opened, started=task.started,
                                       outcome=self.outcome_of(opened, answer), finished=timezone.now())
                return


def _still_pending(step_id: int) -> bool:
    return Step.objects.filter(pk=step_id, status=Step.Status.PENDING).exists()


def _in_flight(now: datetime) -> list[tuple[Step, tuple[int, str]]]:
    steps = (Step.objects.filter(status=Step.Status.PENDING, task_id__gt="", server__isnull=False)
             .exclude(task_until__lte=now).select_related("server", "run"))
    return [(step, (step.run.agent_id, "")) for step in steps]
