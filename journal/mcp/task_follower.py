"""The Recorder follows every task a server made of an agent's call to its end itself, so the outcome is
journaled whether or not the agent ever asks (`tasks/get`): it polls the server with a growing pause, within
the task's time to live, and journals the end the first time it is seen, by it or by the agent's own
`tasks/get` (closing a step is a conditional update: whoever sees the end first journals it, once).

The process following a task marks its step at every look (`Step.task_seen_at`). Every running Recorder
process looks, every `ADOPT_EVERY` seconds, for tasks still in flight that nobody has marked for
`ADOPT_AFTER` (their process was killed, or restarted) and takes each over, exactly one process each (a
conditional update): a task is followed by one process at a time, and by some process as long as one runs.
A task whose time to live runs out unseen is closed by the reconciler as unknown (the server may have
acted)."""

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.db.models import Q
from django.utils import timezone

from .. import services
from ..models import Step
from ..upstream.client import ToolServerError, Upstreams, endpoint_of
from .journal_thread import JournalThread

logger = logging.getLogger(__name__)

FIRST_PAUSE = 1.0  # seconds before the first look: most tasks are not done at once
LONGEST_PAUSE = 15.0  # the pause doubles up to this
GIVE_UP_AFTER = 20  # consecutive failed looks (the server down for minutes): the reconciler takes over
ADOPT_AFTER = 3 * LONGEST_PAUSE  # a task unmarked this long (seconds) has nobody following it
ADOPT_EVERY = LONGEST_PAUSE  # how often each process looks for such tasks


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
        """Take over every task still in flight that nobody follows (`ADOPT_AFTER`): after a restart, or
        another process's that died; how many this process took."""
        taken = 0
        for step, owner in await sync_to_async(_unfollowed)(timezone.now()):
            if step.pk in self.following or not await self.journal.run(
                    services.task_followed, step_id=step.pk, seen=step.task_seen_at, now=timezone.now(),
                    adopt=True):
                continue  # this process follows it already, or another took it first
            self.follow(services.RunningTask(opened=services.opened_again(step), started=step.started_at,
                                             status=step.status), step.task_id, step.task_until, owner)
            taken += 1
        return taken

    async def adopt(self) -> None:
        """For as long as this Recorder runs: `resume` every `ADOPT_EVERY` seconds."""
        await every(ADOPT_EVERY, self.resume, "tasks nobody follows")

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
            if not await self.journal.run(services.task_followed, step_id=opened.step_id, now=timezone.now()):
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


async def every(seconds: float, one_round, what: str) -> None:
    """`await one_round()` now and every `seconds` after, for as long as the Recorder runs (until cancelled):
    a round that fails is logged and the next one tries again (the reconciler is the backstop)."""
    while True:
        try:
            await one_round()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged; the next round tries again
            logger.exception("could not look for %s", what)
        await asyncio.sleep(seconds)


def _unfollowed(now: datetime) -> list[tuple[Step, tuple[int, str]]]:
    quiet = now - timedelta(seconds=ADOPT_AFTER)
    steps = (Step.objects.filter(status=Step.Status.PENDING, task_id__gt="", server__isnull=False)
             .filter(Q(task_seen_at__lt=quiet) | Q(task_seen_at__isnull=True, started_at__lt=quiet))
             .exclude(task_until__lte=now).select_related("server", "run"))
    return [(step, (step.run.agent_id, "")) for step in steps]
