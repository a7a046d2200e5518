"""A server's questions to an agent on the stateless 2026-07-28 protocol.

An older server asks its client in the middle of a call (elicitation, sampling, `roots/list`); a 2026 agent
can only be asked by the call's answer: an `input_required` result that embeds the questions, after which
the agent calls again with its answers and the `requestState` it was given. The bridge holds the server's
call open across the agent's two requests: the first request is answered `input_required` as soon as the
server asks, the retry hands the answers to the waiting server and is answered with whatever the server
does next (its result, or its next question). The call stays one step in the journal. An agent that never
answers gets nothing more: after ANSWER_SECONDS the server is told the agent did not answer.
"""

import asyncio
import secrets
from typing import Any

import mcp_types as types

from ..upstream.client import Owner, endpoint_of
from . import versions

ANSWER_SECONDS = 300.0
ABANDONED = "The agent did not answer: it made another call instead."


class _Pending:
    """One call a server is asking questions in."""

    def __init__(self, owner: Owner, task: asyncio.Task):
        self.id = "recorder:" + secrets.token_urlsafe(18)
        self.owner, self.task = owner, task
        self.questions: list[tuple[str, dict, asyncio.Future]] = []  # asked, not yet put to the agent
        self.waiting: dict[str, asyncio.Future] = {}  # put to the agent, awaiting its answer
        self.asked = asyncio.Event()
        self.awaited = True  # a request of the agent's is waiting for what the call does next
        task.add_done_callback(self._ended)
        self.on_unawaited_end = None

    def _ended(self, task: asyncio.Task) -> None:
        if not self.awaited and self.on_unawaited_end is not None:
            self.on_unawaited_end(self)


class Bridge:
    def __init__(self, *, orphaned=None):
        self.by_id: dict[str, _Pending] = {}
        self.by_owner: dict[Owner, _Pending] = {}
        self.orphaned = orphaned  # async (outcome of the call): a call whose agent stopped asking for it

    def asking(self, owner: Owner) -> bool:
        return owner in self.by_owner

    def free(self, owner: Owner) -> bool:
        """Whether a new call of `owner`'s may be asked by its answer. A question the agent was put and walked
        away from (no request of its waits on that call, and it makes a new one instead of answering) is
        abandoned: the server hears the agent did not answer, and the new call is not kept waiting."""
        pending = self.by_owner.get(owner)
        if pending is not None and not pending.awaited:
            for future in pending.waiting.values():
                if not future.done():
                    future.set_result(types.ErrorData(code=-32603, message=ABANDONED))
            pending.waiting.clear()
            if self.by_owner.get(owner) is pending:
                del self.by_owner[owner]
        return owner not in self.by_owner

    async def ask(self, owner: Owner, request: dict) -> dict | types.ErrorData:
        """Put one of the server's questions to the agent (by the answer to its call) and wait for it."""
        pending = self.by_owner[owner]
        future = asyncio.get_running_loop().create_future()
        pending.questions.append((f"q{len(pending.waiting) + len(pending.questions) + 1}", request, future))
        pending.asked.set()
        try:
            return await asyncio.wait_for(future, ANSWER_SECONDS)
        except TimeoutError:
            return types.ErrorData(code=-32603, message="The agent did not answer in time.")

    async def start(self, owner: Owner, work) -> Any:
        """Run the call (`work`, a coroutine giving what `Recorder.forward` gives); returns that, or an
        `input_required` result as soon as the server asks something."""
        pending = _Pending(owner, asyncio.ensure_future(work))
        pending.on_unawaited_end = self._unawaited
        self.by_owner[owner] = pending
        self.by_id[pending.id] = pending
        return await self._next(pending)

    def resume(self, owner: Owner, retry: dict[str, Any] | None):
        """The agent's retry of a call the server is asking in: hands its answers over and returns an
        awaitable of what the call does next, or None if the retry is not for such a call."""
        pending = self.by_id.get((retry or {}).get("requestState"))
        if pending is None or pending.owner != owner:
            return None
        pending.awaited = True
        answers = (retry or {}).get("inputResponses") or {}
        for key, future in list(pending.waiting.items()):
            if key in answers and not future.done():
                future.set_result(answers[key])
                del pending.waiting[key]
        return self._next(pending)

    async def _next(self, pending: _Pending) -> Any:
        try:
            while not pending.task.done() and not pending.questions:
                pending.asked.clear()
                asked = asyncio.ensure_future(pending.asked.wait())
                try:
                    await asyncio.wait({pending.task, asked}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    asked.cancel()
        except asyncio.CancelledError:  # the agent gave up on the call: so does the Recorder
            pending.task.cancel()
            self._end(pending)
            raise
        if pending.task.done():
            self._end(pending)
            return pending.task.result()
        questions = {}
        for key, request, future in pending.questions:
            pending.waiting[key] = future
            questions[key] = request
        pending.questions.clear()
        pending.awaited = False
        return {"resultType": "input_required", "inputRequests": questions, "requestState": pending.id}, None

    def _unawaited(self, pending: _Pending) -> None:
        """The call ended while its agent had a question and had not come back for the answer."""
        self._end(pending)
        task = pending.task
        if self.orphaned is not None and not task.cancelled() and task.exception() is None:
            asyncio.ensure_future(self.orphaned(task.result()))

    def _end(self, pending: _Pending) -> None:
        self.by_id.pop(pending.id, None)
        if self.by_owner.get(pending.owner) is pending:
            del self.by_owner[pending.owner]


INPUT_ROUNDS = 8  # how many times a server may ask for more input on one call of a handshake agent


async def answered(relay, upstreams, result: dict, owner, opened, tool: str, arguments: dict,
                   meta: dict | None) -> dict:
    """A 2026-07-28 server asks for more input, which an agent on the handshake cannot read as a result:
    its embedded requests go to the agent (through `relay`) as the requests they are, and the call is
    repeated with the answers, as a 2026 client would, for up to INPUT_ROUNDS rounds. What the agent cannot
    answer leaves the result as it was (then journaled as undelivered)."""
    for _ in range(INPUT_ROUNDS):
        asked = result.get("inputRequests") or {}
        if not isinstance(asked, dict) or not asked:
            return result
        answers = {}
        for key, request in asked.items():
            answer = await relay.answer(owner, opened.server.name, request)
            if answer is None:
                return result
            answers[key] = answer
        retry = {"inputResponses": answers, **({"requestState": result["requestState"]}
                                               if "requestState" in result else {})}
        asks = relay.capabilities_of(owner)
        result = await upstreams.call_tool(endpoint_of(opened.server), tool, arguments, meta=meta,
                                           owner=owner, retry=retry, capabilities=asks)
        if result.get("resultType") != versions.INPUT_REQUIRED:
            return result
    return result
