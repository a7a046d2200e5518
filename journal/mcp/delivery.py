"""Whether a handshake agent got the answer to its call.

An agent on the initialize handshake posts each call on its session and reads the answer from that POST's
response. Hanging up does not cancel the call (the protocol says an agent cancels with
`notifications/cancelled`), so the server acts and answers, and the answer goes nowhere. The handler that
journals the call cannot see that: the SDK sends its answer from another task. `AnswerAsJson`, which sees
every POST's response, reports how each call's POST ended (`finished`), and the Recorder's handler reports
the call's journaled outcome (`answered`); whichever comes second decides, and a POST that ended before its
answer went out marks the step undelivered, with the server's answer kept.
"""

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

GONE = "The agent went away before the Recorder could send it the server's answer; the server acted."
MAX_TRACKED = 10_000  # calls whose other half has not reported yet; the oldest are forgotten beyond this


def call_id(body: bytes) -> str | None:
    """The JSON-RPC id of a `tools/call` request body, as the SDK keys its answer streams (a string); None
    for anything else. Only bodies that name the method are parsed."""
    if b"tools/call" not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call" or message.get("id") is None:
        return None
    return str(message["id"])


def cancelled_id(body: bytes) -> str | None:
    """The id of the request a `notifications/cancelled` body cancels (a string), or None for anything
    else."""
    if b"notifications/cancelled" not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "notifications/cancelled":
        return None
    params = message.get("params")
    if not isinstance(params, dict) or params.get("requestId") is None:
        return None
    return str(params["requestId"])


class Deliveries:
    def __init__(self, lost: Callable[[Any, str], Awaitable[None]]):
        self._lost = lost  # (the outcome's journal write, why): journals that its answer was not delivered
        self._answered: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._hung_up: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def answered(self, session_id: str, request_id: Any, journaled) -> None:
        """The call's outcome is journaled and its answer is about to go out on the call's POST."""
        key = (session_id, str(request_id))
        if key in self._hung_up:
            del self._hung_up[key]
            await self._lost(journaled, GONE)
        else:
            _remember(self._answered, key, journaled)

    async def finished(self, session_id: str, request_id: str, *, delivered: bool) -> None:
        """The call's POST ended, with its answer sent or not (the agent hung up first)."""
        key = (session_id, request_id)
        journaled = self._answered.pop(key, None)
        if delivered:
            return
        if journaled is not None:
            await self._lost(journaled, GONE)
        else:  # the server has not answered yet: the answer, when it comes, goes nowhere
            _remember(self._hung_up, key, None)

    def forget(self, session_id: str) -> None:
        """The session ended: nothing more of it will report."""
        for tracked in (self._answered, self._hung_up):
            for key in [key for key in tracked if key[0] == session_id]:
                del tracked[key]


def _remember(tracked: OrderedDict, key, value) -> None:
    tracked[key] = value
    while len(tracked) > MAX_TRACKED:
        tracked.popitem(last=False)
