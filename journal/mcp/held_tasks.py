"""A held call as a task, for a 2026 agent that declared the tasks extension on its call: instead of "this
call awaits approval, call again once it is approved", the agent gets a task handle at once (`held:<the
held call's id>`), and the Recorder itself waits for the approvers (until the approval request expires):
approved, it sends the call, once, and the task completes with the server's real result (or fails with its
JSON-RPC error); denied or expired, the task completes with that, as a tool error. `tasks/get` on the handle
says where it stands ("Waiting for approval at <link>" while it waits).

The wait runs in the Recorder process that took the call; the held step is marked alive meanwhile, like any
held call. When that process dies (or restarts), another running Recorder process, or the restarted one,
takes the wait over (`adopt_orphans`, exactly one of them, within `ADOPT_AFTER_SECONDS` and a beat), and the
task goes on as before: `tasks/get` in any process reads the record. Only when no Recorder runs for
`ports.HOLD_LOST_SECONDS` does the reconciler close the step ("the Recorder holding it stopped: never sent"),
and `tasks/get` then says so."""

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import mcp_types as types
from asgiref.sync import sync_to_async
from django.utils import timezone
from mcp import MCPError

from .. import ports, services
from ..models import Agent, Step
from . import earlier as earlier_reads
from . import holding
from .failing import tool_error
from .task_follower import every

logger = logging.getLogger(__name__)

PREFIX = "held:"  # no server is named so (a server's tasks are `server__taskId`)
POLL_MS = 2000  # what the agent is told as its polling interval


def handle_of(held: ports.HeldCall) -> str:
    return PREFIX + held.public_id


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _wire(result: Any) -> dict[str, Any]:
    if isinstance(result, types.CallToolResult):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(result)


class HeldTasks:
    """The held calls this process waits on for agents as tasks, and how each ended."""

    def __init__(self):
        self.waiting: dict[str, dict[str, Any]] = {}  # handle -> what tasks/get says of it
        self.running: set[asyncio.Task] = set()

    def start(self, held: ports.HeldCall, expires_at: datetime | None,
              work: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
        """The task handle the agent gets for `held`; `work()` waits for the decision and sends the call,
        returning its result (a tool error when it was not sent), or raising the server's MCPError."""
        handle, created = handle_of(held), _now()
        ttl = max(int((expires_at - datetime.now(UTC)).total_seconds() * 1000), 0) if expires_at else None
        task = {"taskId": handle, "status": "working", "createdAt": created, "lastUpdatedAt": created,
                "pollIntervalMs": POLL_MS, "statusMessage": f"Waiting for approval at {held.url}",
                **({"ttlMs": ttl} if ttl is not None else {})}
        self.waiting[handle] = task
        running = asyncio.get_running_loop().create_task(self._run(handle, work), name=f"held task {handle}")
        self.running.add(running)
        running.add_done_callback(self.running.discard)
        return {**task, "resultType": "task"}

    async def _run(self, handle: str, work: Callable[[], Awaitable[Any]]) -> None:
        task = self.waiting[handle]
        try:
            task.update(status="completed", result=_wire(await work()))
        except MCPError as exc:
            task.update(status="failed", error=exc.error.model_dump(mode="json", by_alias=True,
                                                                    exclude_none=True))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the record says what happened; the agent hears it failed
            logger.exception("a held call's task %s failed inside the Recorder", handle)
            task.update(status="failed", error={"code": -32603, "message": "The Recorder failed while it "
                                                "held this call; see the run's record for what was sent."})
        task.pop("statusMessage", None)
        task["lastUpdatedAt"] = _now()

    async def get(self, agent: Agent, handle: str) -> dict[str, Any]:
        """What `tasks/get` says of a held call's task: this process's own, or as the record has it."""
        try:
            public_id = str(uuid.UUID(handle.removeprefix(PREFIX)))
        except ValueError:
            public_id = None
        step = await sync_to_async(_step_of)(agent, public_id) if public_id else None
        if step is None:
            raise MCPError(code=-32602, message=f"Failed to retrieve task: no task {handle!r} of this "
                           "agent's")
        if handle in self.waiting:
            return {**self.waiting[handle]}
        stamp = step.finished_at.isoformat() if step.finished_at else _now()
        base = {"taskId": handle, "createdAt": step.started_at.isoformat(), "lastUpdatedAt": stamp,
                "pollIntervalMs": POLL_MS}
        if step.status in (Step.Status.HELD, Step.Status.PENDING):
            return {**base, "status": "working", "statusMessage": "Waiting for approval, or being sent."}
        if step.status == Step.Status.OK and isinstance(step.result, dict):
            return {**base, "status": "completed", "result": step.result}
        message = step.error_message or "The call ended without a result the record keeps."
        return {**base, "status": "completed", "result": {
            "content": [{"type": "text", "text": message}], "isError": True}}

    async def close(self) -> None:
        for running in list(self.running):
            running.cancel()


def _step_of(agent: Agent, public_id: str) -> Step | None:
    """The first step held on the call `public_id`, if it is `agent`'s."""
    return (Step.objects.filter(held_call=public_id, run__agent=agent).order_by("pk")
            .only("status", "result", "error_message", "started_at", "finished_at").first())


# A held call as a task waits for approvers until its approval request expires (which ends the wait).
WAIT_SECONDS = 30 * 24 * 3600


async def held_as_task(journal, upstreams, held_tasks: HeldTasks, complete, *, agent: Agent, opened,
                       started, owner, arguments: dict, version: str) -> Any:
    """The agent's held call as a task (see the module): the handle now, the call sent once approved."""
    held = await holding.open_hold(journal, agent, opened, task=True)
    if not isinstance(held, ports.HeldCall):
        return tool_error(*held)
    standing = await sync_to_async(ports.gate().state)(held.id)
    work = _work(journal, upstreams, complete, held=held, opened=opened, started=started, owner=owner,
                 arguments=arguments, version=version)
    return held_tasks.start(held, standing.expires_at if standing else None, work)


def _work(journal, upstreams, complete, *, held: ports.HeldCall, opened, started, owner, arguments: dict,
          version: str) -> Callable[[], Awaitable[Any]]:
    """Wait for the decision on `held`, then send the call once: its result, or a tool error saying why it
    was not sent."""

    async def work():
        refusal, sent = await holding.decided(journal, opened, held, None, WAIT_SECONDS, agent_waits=False)
        released = opened
        if refusal is None:  # approved and released: a recipe reads the record again, as it is now
            released, refusal = await earlier_reads.again(journal, upstreams, opened, arguments, owner)
        if refusal is not None:
            return tool_error(*refusal)
        result, journaled = await complete(released, started, owner=owner, session=None, tool=opened.tool,
                                           arguments=arguments, meta=sent, version=version, retry=None,
                                           logged=None, tasks=False, progress=None)
        if journaled is not None:
            await journaled
        return result

    return work


# A held task whose process has not marked it for this long has nobody waiting on it: another process takes
# it over (well before the reconciler would close it as never sent, `ports.HOLD_LOST_SECONDS`).
ADOPT_AFTER_SECONDS = 2 * ports.HOLD_BEAT_SECONDS


async def adopt_orphans(journal, upstreams, held_tasks: HeldTasks, complete, version: str) -> None:
    """For as long as this Recorder runs: every `ports.HOLD_BEAT_SECONDS`, take over the held calls agents
    have as tasks whose process stopped waiting on them (killed, or restarted), exactly one process each,
    and wait on them here as their own process did."""

    async def one_round():
        for step, held in await sync_to_async(_orphans)(timezone.now()):
            if held_tasks.waiting.get(handle_of(held), {}).get("status") == "working":
                continue
            if not await journal.run(services.adopt_held_task, step_id=step.pk, seen=step.held_seen_at,
                                     now=timezone.now()):
                continue  # another process took it
            logger.info("took over waiting on held call %s (step %s)", held.public_id, step.pk)
            standing = await sync_to_async(ports.gate().state)(held.id)
            opened = dataclasses.replace(services.opened_again(step), policy=step.policy_decision or {},
                                         earlier=step.earlier_state)
            work = _work(journal, upstreams, complete, held=held, opened=opened, started=step.started_at,
                         owner=(step.run.agent_id, ""), arguments=step.arguments or {}, version=version)
            held_tasks.start(held, standing.expires_at if standing else None, work)

    await every(ports.HOLD_BEAT_SECONDS, one_round, "held tasks to take over")


def _orphans(now: datetime) -> list[tuple[Step, ports.HeldCall]]:
    stale = now - timedelta(seconds=ADOPT_AFTER_SECONDS)
    steps = (Step.objects.filter(status=Step.Status.HELD, held_task=True, held_seen_at__lt=stale)
             .exclude(held_call="").select_related("server", "run"))
    gate = ports.gate()
    return [(step, held) for step in steps if (held := gate.held_call(step.held_call)) is not None]
