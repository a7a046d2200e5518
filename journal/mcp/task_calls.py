"""The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) through the Recorder.

A 2026-07-28 agent that declares the extension on a `tools/call` has it declared to the server for that call;
a server that answers with a task handle (`resultType: "task"`) has its call journaled once: the intent as any
call's, a `task` entry (the step in flight, its outcome unknown), then the outcome when a `tasks/get` first
sees the task end (`completed`: the tool's result; `failed`: its JSON-RPC error; `cancelled`: cancelled, and
the server may have acted). The agent names a task `server__taskId`, as it names tools, and only the agent
whose call made the task can ask about it. `tasks/update` (the agent's answers to a task's questions) and
`tasks/cancel` (journaled like any cancel) go to the server as sent.
"""

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

import mcp_types as types
from django.utils import timezone
from mcp import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from mcp_types import methods as _methods
from pydantic import Field, ValidationError

from .. import services
from ..undo import outcomes
from ..upstream.client import ToolServerError, Upstreams, endpoint_of
from ..upstream.connection import TASKS_EXTENSION
from ..upstream.failures import translate
from . import held_tasks, versions
from .context import SEPARATOR, agent_of, owner_of, recorder_error, session_of, upstream_error
from .failing import advice_meta, failed, tool_error
from .held_tasks import HeldTasks
from .journal_thread import JournalThread
from .task_follower import TaskFollower

logger = logging.getLogger(__name__)

STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
ENDED = ("completed", "failed", "cancelled")
INVALID_PARAMS = -32602
MISSING_CAPABILITY = -32021
_MAX_TASK_ID = 200  # the step's column


class TaskParams(types.RequestParams):
    """The params of `tasks/get`, `tasks/update` and `tasks/cancel`."""

    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = Field(alias="inputResponses", default=None)


def declares_tasks(meta: Any) -> bool:
    """Whether a 2026-07-28 request's `_meta` declares the tasks extension (it is declared per request)."""
    declared = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
    extensions = declared.get("extensions") if isinstance(declared, dict) else None
    return isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)


def with_tasks(capabilities: dict | None, tasks: bool) -> dict | None:
    """The capabilities a call declares to a stateless server, with the tasks extension when the agent's
    request declared it."""
    if not tasks:
        return capabilities
    return {**(capabilities or {}), "extensions": {TASKS_EXTENSION: {}}}


def _handle_problem(result: dict) -> str | None:
    task_id, status = result.get("taskId"), result.get("status")
    if not isinstance(task_id, str) or not task_id or len(task_id) > _MAX_TASK_ID:
        return f"its task handle has no usable taskId (a string of 1 to {_MAX_TASK_ID} characters)"
    if status not in STATUSES:
        return f"its task handle's status {status!r} is not one of {', '.join(STATUSES)}"
    return None


def _of_the_extension(ctx) -> None:
    """Refuse a request of the tasks extension from an agent that may not make one."""
    if ctx.session.protocol_version not in versions.MODERN:
        raise MCPError(code=-32601, message="Method not found")
    if not declares_tasks(ctx.meta):
        raise MCPError(code=MISSING_CAPABILITY, message="This request is of the tasks extension "
                       f"({TASKS_EXTENSION}); the client did not declare it for this request.",
                       data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})


def outcome_of(opened: services.OpenedStep, answer: dict) -> services.Outcome:
    """The step's outcome from its task's end, as `tasks/get` reports it: `completed`, the tool's result (a
    tool error with its advice); `failed`, its JSON-RPC error; `cancelled`, cancelled (the server may have
    acted). The same whoever sees the end: the agent's `tasks/get` or the Recorder's own (`TaskFollower`)."""
    server, status = opened.server.name, answer.get("status")
    if status == "completed":
        result = versions.from_server(answer.get("result") if isinstance(answer.get("result"), dict) else {})
        recovery = (failed(outcomes.classify_tool_error(result), opened.traits).as_wire()
                    if result.get("isError") is True else None)
        return services.Outcome(result=result, recovery=recovery)
    if status == "failed":
        error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
        code = error.get("code") if isinstance(error.get("code"), int) else -32603
        said = MCPError(code=code, message=str(error.get("message", "")), data=error.get("data"))
        exc = translate(said, server=server, sent=True)
        return services.Outcome(error_message=f"{server}'s task failed: {exc.message}",
                                failure_class=exc.failure_class, may_have_acted=True,
                                recovery=failed(exc.failure_class, opened.traits,
                                                may_have_acted=True).as_wire())
    return services.Outcome(may_have_acted=True, cancelled=(
        f"The task was cancelled on {server}; the server may have acted before it stopped."))


class TaskCalls:
    """The Recorder's half of the tasks extension: `started` for a call the server made a task, and the
    handlers of the extension's three methods (`install`)."""

    def __init__(self, journal: JournalThread, upstreams: Upstreams, remember):
        self.journal, self.upstreams = journal, upstreams
        self.remember = remember  # what a result hands the agent is readable through the Recorder after
        self.follower = TaskFollower(journal, upstreams, outcome_of)  # the outcome, whether the agent asks
        self.held = HeldTasks()  # held calls waited on as tasks (`held_tasks`)
        self.adopting: list[asyncio.Task] = []

    async def resume(self, complete) -> None:
        """At the Recorder's start, and from then on: take over the tasks in flight that nobody follows
        (`TaskFollower.adopt`), and the held calls agents have as tasks whose process stopped waiting on them
        (`held_tasks.adopt_orphans`; `complete` sends an approved one, as `Gateway._complete`)."""
        loop = asyncio.get_running_loop()
        await self.follower.resume()
        self.adopting = [loop.create_task(self.follower.adopt(), name="adopt tasks"), loop.create_task(
            held_tasks.adopt_orphans(self.journal, self.upstreams, self.held, complete, max(versions.MODERN)),
            name="adopt held tasks")]

    async def close(self) -> None:
        """Stop following tasks and waiting on held calls (the record says where each stands)."""
        for adopting in self.adopting:
            adopting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await adopting
        await self.follower.close()
        await self.held.close()

    def install(self, server) -> None:
        """Serve the extension's methods on the SDK's `server`, and declare it."""
        server.extensions[TASKS_EXTENSION] = {}
        for method, handler in (("tasks/get", self.get), ("tasks/update", self.update),
                                ("tasks/cancel", self.cancel)):
            server.add_request_handler(method, TaskParams, handler)

    async def started(self, opened: services.OpenedStep, started, result: dict, *, declared: bool,
                      owner=None):
        """The server answered the call with a task handle: journal it and give the agent the handle, named
        as the agent names the task. A handle the agent did not ask for, or one that is not a handle, is
        journaled as a call whose outcome is unknown (the server may be at work) and answered as such."""
        server = opened.server.name
        problem = None if declared else "the agent did not declare the tasks extension on this call"
        problem = problem or _handle_problem(result)
        if problem is not None:
            message = (f"{server} answered with a task handle that cannot be delivered: {problem}. "
                       "The server may be at work; do not repeat the call blindly.")
            advice = failed("unknown", opened.traits, may_have_acted=True, answered=True)
            await self.journal.run(services.close_step, opened=opened, started=started,
                                   finished=timezone.now(), outcome=services.Outcome(
                                       error_message=message, failure_class="unknown", may_have_acted=True,
                                       recovery=advice.as_wire()))
            return tool_error(message, advice)
        now = timezone.now()
        if await self.journal.run(services.task_started, opened=opened, task_id=result["taskId"],
                                  status=result["status"], ttl_ms=result.get("ttlMs"), now=now):
            ttl = result.get("ttlMs")
            until = now + timedelta(milliseconds=ttl) if isinstance(ttl, int) and ttl >= 0 else None
            self.follower.follow(services.RunningTask(opened=opened, started=started, status="pending"),
                                 result["taskId"], until, owner)
        return {**result, "taskId": f"{server}{SEPARATOR}{result['taskId']}"}

    async def _task(self, ctx, params: TaskParams) -> tuple[services.RunningTask, str, str]:
        """The journaled task the agent names, its server and the server's own id; an error the agent reads
        when the agent has no such task."""
        _of_the_extension(ctx)
        if params.task_id.startswith(held_tasks.PREFIX):
            raise MCPError(code=INVALID_PARAMS, message="This task is a call waiting for approval: it is "
                           "neither updated nor cancelled by the agent (an approver denies it).")
        server, separator, task_id = params.task_id.partition(SEPARATOR)
        agent = agent_of(ctx)
        named = separator and task_id and len(task_id) <= _MAX_TASK_ID and "\x00" not in params.task_id
        task = await self.journal.run(services.running_task, agent=agent, server_name=server[:60],
                                      task_id=task_id) if named else None
        if task is None or task.opened.server is None:
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: no task "
                           f"{params.task_id!r} of this agent's (tasks are named server__taskId)")
        return task, server, task_id

    async def _ask(self, ctx, task: services.RunningTask, method: str, params: dict) -> dict:
        owner = owner_of(agent_of(ctx), session_of(ctx), ctx.meta)
        try:
            return await self.upstreams.task_request(endpoint_of(task.opened.server), method, params,
                                                     owner=owner)
        except ToolServerError as exc:
            if exc.code is not None:
                raise upstream_error(exc) from None
            raise recorder_error(-32603, f"{exc.message} ({exc.failure_class}).", reason="upstream",
                                 advice=failed(exc.failure_class, retry_after=exc.retry_after)) from None

    async def get(self, ctx, params: TaskParams) -> dict:
        """The task as the server reports it, named as the agent names it; its end is journaled when first
        seen, and a completed task's result reaches the agent shaped for its protocol, as a call's would."""
        if params.task_id.startswith(held_tasks.PREFIX):
            _of_the_extension(ctx)
            return await self.held.get(agent_of(ctx), params.task_id)
        task, server, task_id = await self._task(ctx, params)
        answer = await self._ask(ctx, task, "tasks/get", {"taskId": task_id})
        status = answer.get("status")
        if status not in STATUSES:
            raise recorder_error(-32603, f"{server} answered tasks/get with status {status!r}, which is "
                                 "not a task's", reason="upstream")
        if status in ENDED:
            answer = await self._ended(ctx, task, answer)
        return {**answer, "taskId": params.task_id}

    async def _ended(self, ctx, task: services.RunningTask, answer: dict) -> dict:
        opened, server, status = task.opened, task.opened.server.name, answer["status"]
        version = ctx.session.protocol_version
        if status != "completed":
            await self._close(task, outcome_of(opened, answer))
            return answer
        result = versions.from_server(answer.get("result") if isinstance(answer.get("result"), dict) else {})
        try:
            shaped = _methods.serialize_server_result("tools/call", version,
                                                      versions.for_client(result, version=version))
        except (versions.Untranslatable, ValidationError, KeyError, ValueError):
            message = (f"{server}'s task completed, but its result is not a tools/call result of "
                       f"protocol {version}. The server acted; do not repeat the call blindly.")
            await self._close(task, services.Outcome(result=result, undelivered=message))
            raise recorder_error(-32603, message, reason="undelivered",
                                 advice=failed("unknown", may_have_acted=True, answered=True)) from None
        self.remember(owner_of(agent_of(ctx), session_of(ctx), ctx.meta), server, result)
        outcome = outcome_of(opened, answer)
        if outcome.recovery is not None:
            shaped["_meta"] = advice_meta(failed(outcomes.classify_tool_error(result), opened.traits),
                                          shaped.get("_meta"))
        await self._close(task, outcome)
        return {**answer, "result": shaped}

    async def _close(self, task: services.RunningTask, outcome: services.Outcome) -> None:
        # close_step closes only a step still in flight: the first to see the end journals it, once.
        await self.journal.run(services.close_step, opened=task.opened, outcome=outcome, started=task.started,
                               finished=timezone.now())

    async def update(self, ctx, params: TaskParams) -> dict:
        """The agent's answers to what the task asked, to the server as sent."""
        task, _, task_id = await self._task(ctx, params)
        await self._ask(ctx, task, "tasks/update", {"taskId": task_id,
                                                    "inputResponses": params.input_responses or {}})
        return {}

    async def cancel(self, ctx, params: TaskParams) -> dict:
        """The agent cancels the task: journaled like any cancel, then asked of the server. What became of
        the task is journaled when it is seen (cancelled, or ended before the cancel could take effect)."""
        task, _, task_id = await self._task(ctx, params)
        if task.status == "pending":
            await self.journal.run(services.task_cancelled, task=task, now=timezone.now())
        await self._ask(ctx, task, "tasks/cancel", {"taskId": task_id})
        try:  # a task that stopped at once is journaled now: the agent need not ask again
            answer = await self._ask(ctx, task, "tasks/get", {"taskId": task_id})
            if answer.get("status") in ENDED:
                await self._ended(ctx, task, answer)
        except MCPError as exc:
            logger.info("could not read task %s after its cancel: %s", params.task_id, exc.error.message)
        return {}
