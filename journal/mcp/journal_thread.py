"""Where the Recorder's journal work runs: one thread with one database connection of its own, and the
directory of enabled tool servers it reads them from."""

import asyncio
import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection

from .. import services, sql
from ..models import ToolServer


class JournalThread:
    """The Recorder's journal work, on one thread with one database connection of its own.

    Jobs run one at a time in the order they were handed in. That order is the guarantee the Recorder
    relies on: a call's outcome is queued before its answer goes back to the agent, so the next call of
    that agent (and a test's `settle`) always finds it journaled, while the answer itself does not wait
    for the commit. Shutting down runs every queued job first, so a restart loses nothing.
    """

    def __init__(self):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recorder-journal")
        self.servers = ServerDirectory()  # only ever touched on this thread

    def _job(self, fn, kwargs):
        try:
            return fn(**kwargs)
        except Exception:
            # A broken connection must not poison every later job; Django reconnects on next use.
            connection.close()
            raise

    def submit(self, fn, /, **kwargs) -> asyncio.Future:
        """Queue `fn(**kwargs)` now; await the future for its result."""
        return asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(self._job, fn, kwargs))

    async def run(self, fn, /, **kwargs):
        return await self.submit(fn, **kwargs)

    def settle(self) -> None:
        """Wait (from any thread) until everything queued so far has run."""
        self._executor.submit(lambda: None).result()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already closed
            self._executor.submit(connection.close)
        self._executor.shutdown(wait=True)


class ServerDirectory:
    """The enabled tool servers by name, each kept until its row's `updated_at` moves.

    A call checks one small indexed row instead of loading and parsing the server's whole catalogue, so a
    catalogue refresh or an admin edit still takes effect on the very next call."""

    def __init__(self):
        self._known: dict[str, tuple[Any, ToolServer]] = {}

    def get(self, name: str) -> ToolServer | None:
        row = sql.first_row(ToolServer, ("id", "updated_at"), "name = %s AND enabled = %s",
                            [name, sql.prep(ToolServer, "enabled", True)])
        if row is None:
            self._known.pop(name, None)
            return None
        pk, stamp = row
        known = self._known.get(name)
        if known is not None and known[0] == stamp:
            return known[1]
        server = ToolServer.objects.filter(pk=pk).first()
        if server is not None:
            self._known[name] = (stamp, server)
        return server


class Journaled:
    """The journal write of a call's outcome, already queued: await it (again, once it is done).
    `opened` is the step it closes."""

    def __init__(self, written, opened: services.OpenedStep):
        self.written, self.opened, self.done = written, opened, False

    def __await__(self):
        if not self.done:
            yield from self.written.__await__()
            self.done = True
