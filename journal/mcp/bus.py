"""Messages every Recorder process hears, for what must reach the process that holds something: an agent's
cancellation of a call another process is making (`Cancels`).

Over Redis pub/sub when RECORDER_BUS_URL is set (it defaults to REDIS_URL); without it, a message reaches
this process only, which is all one process needs. A message that cannot be published (Redis down) is
logged and handled here, so nothing a single process could do is lost.

Anyone who can reach the Redis server can publish on its channels, so every message is signed (HMAC-SHA256
with a key the processes derive from their shared SECRET_KEY, `bus_key`) and dated: a message that is not
signed with that key, or is older than MAX_AGE_SECONDS, is dropped and logged, never handled.
"""

import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import redis.asyncio as redis

logger = logging.getLogger(__name__)

CHANNEL = "agent-undo:recorder"
MAX_AGE_SECONDS = 60.0  # a signed message older than this (a replay) is dropped


def bus_key(secret_key: str) -> bytes:
    """The key every Recorder process signs its bus messages with, derived from the shared SECRET_KEY."""
    return hmac.new(secret_key.encode(), b"agent-undo: the Recorders' bus", hashlib.sha256).digest()


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class Bus:
    def __init__(self, url: str = "", key: bytes = b""):
        self.url = url
        self.key = key or bus_key("")  # a process of its own (no bus URL) still signs what it hears
        self.handlers: dict[str, Handler] = {}
        self._redis = None
        self._group: anyio.abc.TaskGroup | None = None

    def on(self, kind: str, handler: Handler) -> None:
        self.handlers[kind] = handler

    async def __aenter__(self) -> "Bus":
        if self.url:
            self._redis = redis.from_url(self.url)
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            ready = anyio.Event()
            self._group.start_soon(self._listen, ready)
            with anyio.move_on_after(5):
                await ready.wait()
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._group is not None:
            self._group.cancel_scope.cancel()
            with contextlib.suppress(Exception):
                await self._group.__aexit__(None, None, None)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()

    async def publish(self, kind: str, data: dict[str, Any]) -> None:
        body = json.dumps({"kind": kind, "data": data, "at": time.time()})
        message = json.dumps({"body": body, "mac": _mac(self.key, body)})
        if self._redis is not None:
            try:
                await self._redis.publish(CHANNEL, message)
                return
            except Exception as exc:  # noqa: BLE001 - what this process can still do, it does
                logger.warning("the Recorder's bus is unreachable (%s); %s handled in this process only",
                               type(exc).__name__, kind)
        await self._dispatch(message)

    async def _listen(self, ready: anyio.Event) -> None:
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    ready.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await self._dispatch(message["data"])
            except Exception as exc:  # noqa: BLE001 - listened to again
                logger.warning("the Recorder's bus broke (%s); listening again", type(exc).__name__)
            ready.set()
            await anyio.sleep(1.0)

    async def _dispatch(self, raw: bytes | str) -> None:
        try:
            message = self._verified(raw)
            if message is None:
                return
            handler = self.handlers.get(message["kind"])
            if handler is not None:
                await handler(message["data"])
        except Exception:
            logger.exception("a message on the Recorder's bus could not be handled")


    def _verified(self, raw: bytes | str) -> dict[str, Any] | None:
        """The message, if a Recorder process signed it with the shared key within MAX_AGE_SECONDS."""
        try:
            signed = json.loads(raw)
            body, mac = signed["body"], signed["mac"]
            ok = isinstance(body, str) and isinstance(mac, str) \
                and hmac.compare_digest(_mac(self.key, body), mac)
            message = json.loads(body) if ok else None
        except (ValueError, TypeError, KeyError):
            message = None
        if not isinstance(message, dict) or not isinstance(message.get("at"), int | float) \
                or abs(time.time() - message["at"]) > MAX_AGE_SECONDS:
            logger.warning("dropped a message on the Recorder's bus that no Recorder signed (or a stale one)")
            return None
        return message


class Cancels:
    """The calls of handshake sessions in flight in this process, by (session, request id), so that an
    agent's `notifications/cancelled`, whichever process it reached, cancels the call where it runs."""

    def __init__(self, bus: Bus):
        self.bus = bus
        self._scopes: dict[tuple[str, str], anyio.CancelScope] = {}
        bus.on("cancel", self._cancel)

    @contextlib.contextmanager
    def watch(self, session_id: str | None, request_id: Any):
        scope = anyio.CancelScope()
        key = (session_id, str(request_id)) if session_id else None
        if key is not None:
            self._scopes[key] = scope
        try:
            with scope:
                yield scope
        finally:
            if key is not None and self._scopes.get(key) is scope:
                del self._scopes[key]

    async def cancelled(self, session_id: str, request_id: Any) -> None:
        """The agent cancelled one of its calls (the notification reached this process)."""
        await self.bus.publish("cancel", {"session": session_id, "requestId": str(request_id)})

    async def _cancel(self, data: dict[str, Any]) -> None:
        scope = self._scopes.get((str(data.get("session")), str(data.get("requestId"))))
        if scope is not None:
            scope.cancel()
