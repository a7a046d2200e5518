"""Where the Recorder's journal work runs: one thread with one database connection of its own, the
directory of enabled tool servers it reads them from, and the writes of calls' outcomes (`Outcomes`)."""

import asyncio
import atexit
import contextlib
import contextvars
import logging
import queue
import threading
import time
import weakref
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from .. import services
from ..models import ToolServer
from ..record import sql
from ..telemetry import metrics, tracing

logger = logging.getLogger(__name__)


class JournalThread:
    """The Recorder's journal work, on one thread with one database connection of its own, committed in
    groups.

    Jobs run one at a time in the order they were handed in. That order is the guarantee the Recorder
    relies on: a call's outcome is queued before its answer goes back to the agent, so the next call of
    that agent (and a test's `settle`) always finds it journaled, and the answer waits for its commit.
    Shutting down runs every queued job first, so a restart loses nothing.

    **Group commit.** The thread takes every job waiting at that moment (up to `MAX_BATCH`) and runs them in
    one transaction, so twenty concurrent calls cost one commit, not twenty. A job's result is handed back
    only once that transaction has committed: a call is forwarded only after the transaction holding its
    intent committed (never on a commit that might not happen). The group makes no savepoints (see
    `_together`): if any job fails, the whole group is rolled back and each of its jobs runs alone, in
    order, as it always ran: in its own transaction, where a failing job undoes only its own writes and
    gets its own error. A group of one is the job alone. When the commit itself fails, every job of the
    group fails with it, as a job whose own commit failed always did.

    Each job runs in a copy of the context it was handed in from, so its spans are children of the call
    that queued it and its log lines name that call's run and step; each group's time to commit is
    measured (`undo_journal_commit_seconds`, and a `journal commit` span in every traced job's trace).
    """

    MAX_BATCH = 64

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.servers = ServerDirectory()  # only ever touched on this thread
        self._thread = threading.Thread(target=self._serve, name="recorder-journal", daemon=True)
        self._thread.start()
        # A process that exits without closing it still runs every queued job first.
        atexit.register(_close, weakref.ref(self))

    def submit(self, fn, /, **kwargs) -> asyncio.Future:
        """Queue `fn(**kwargs)` now; await the future for its result."""
        if self._closed:
            raise RuntimeError("the journal thread is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(result, error) -> None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits for it any more
                loop.call_soon_threadsafe(_settle_future, future, result, error)

        self._jobs.put((fn, kwargs, done, contextvars.copy_context()))
        return future

    async def run(self, fn, /, **kwargs):
        return await self.submit(fn, **kwargs)

    def settle(self) -> None:
        """Wait (from any thread) until everything queued so far has run and committed."""
        ran = threading.Event()
        self._jobs.put((lambda: None, {}, lambda result, error: ran.set(), contextvars.copy_context()))
        ran.wait()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._jobs.put(_STOP)
        self._thread.join()

    def _serve(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._jobs.get()]
            while len(batch) < self.MAX_BATCH:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            if _STOP in batch:
                stopping = True
                batch = [job for job in batch if job is not _STOP]
            if batch:
                metrics.JOURNAL_QUEUE.set(self._jobs.qsize())
                began = time.perf_counter()
                self._group(batch)
                _measured(batch, began, time.perf_counter())
        connection.close()

    def _group(self, batch: list) -> None:
        """Run `batch` in one transaction and hand each job its result once it has committed; if any job
        fails, nothing of the group is kept and each job runs alone, in order (`_alone`). A group of one is
        the job alone."""
        if len(batch) == 1:
            return self._alone(batch[0])
        try:
            results = self._together(batch)
        except _Alone:
            for job in batch:
                self._alone(job)
            return
        except Exception as error:  # the commit failed: nothing of the group is written
            connection.close()
            for _, _, done, _ in batch:
                done(None, error)
            return
        for (_, _, done, _), result in zip(batch, results, strict=True):
            done(result, None)

    @staticmethod
    def _together(batch: list) -> list:
        """Every job of `batch`, one after the other, in one transaction without savepoints: a job's own
        `atomic` blocks join the group's (a savepoint costs two statements, which on PostgreSQL is two round
        trips, and a call's intent or outcome is only four or five statements of its own). Without
        savepoints a failure cannot be undone alone, so the first one rolls the whole group back (`_Alone`);
        nothing of it was written, and each job then runs as it always did. On PostgreSQL the group's
        statements are pipelined (`sql.pipelined`): those whose answer nobody reads go with the next. What
        is the same for every job at one moment is read once per group (`sql.one_moment`): a server's stamp,
        the policies' head, a run the group has locked."""
        results = []
        with transaction.atomic():
            try:
                with sql.pipelined(), sql.one_moment(), _without_savepoints():
                    for fn, kwargs, _, context in batch:
                        results.append(context.run(fn, **kwargs))
            except Exception as error:  # from a job, or from a statement a job sent (`sql.pipelined`)
                raise _Alone from error
        return results

    def _alone(self, job) -> None:
        """One job as it always ran: its own transactions (every journal write is in an `atomic` block of
        its own), its own commits, its own savepoints, so a job that fails undoes only its own writes and
        gets its own error, and a failure a job handles itself (another process created the run a moment
        ago) is undone to its savepoint as the job expects."""
        fn, kwargs, done, context = job
        try:
            result = context.run(fn, **kwargs)
        except Exception as error:
            # A broken connection must not poison every later job; Django reconnects on next use.
            connection.close()
            done(None, error)
        else:
            done(result, None)


def _measured(batch: list, began: float, ended: float) -> None:
    """The group's time from its first statement to its commit, counted, and shown in each traced job's
    trace as its `journal commit` span."""
    metrics.JOURNAL_COMMIT_SECONDS.observe(ended - began)
    metrics.JOURNAL_GROUP_SIZE.observe(len(batch))
    if tracing.on():
        for _, _, _, context in batch:
            context.run(tracing.span_between, "journal commit", began, ended,
                        {"undo.journal.group": len(batch)})


class _Alone(Exception):
    """A job of a group failed: the group is rolled back, and its jobs run alone."""


@contextlib.contextmanager
def _without_savepoints():
    """Inside it, `atomic` blocks on this thread's connection make no savepoints: they join the transaction
    around them, and one that fails marks it for rollback, exactly as `atomic(savepoint=False)` does (an
    `atomic` block takes a savepoint id of None as "no savepoint": that is how Django itself declines one).
    The journal thread's connection is its own, so nothing else sees the difference."""
    connection.savepoint = lambda: None
    try:
        yield
    finally:
        del connection.savepoint  # the connection's own method again


_STOP = object()


def _close(thread: "weakref.ref[JournalThread]") -> None:
    if (journal := thread()) is not None:
        journal.close()


def _settle_future(future: asyncio.Future, result, error) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class ServerDirectory:
    """The enabled tool servers by the prefix an agent calls them by (name or alias), each kept until its
    row's `updated_at` moves.

    A call checks one small indexed row instead of loading and parsing the server's whole catalogue, so a
    catalogue refresh or an admin edit still takes effect on the very next call."""

    def __init__(self):
        self._known: dict[str, tuple[Any, ToolServer]] = {}

    def known(self, name: str) -> ToolServer | None:
        """The server as last read, without asking the database (it may be stale: `get` says for sure)."""
        known = self._known.get(name)
        return known[1] if known is not None else None

    def get(self, name: str) -> ToolServer | None:
        """The server, checked against its row (once per journal group: `sql.one_moment`)."""
        row = sql.remembered(("server", name), lambda: sql.first_row(
            ToolServer, ("id", "updated_at"), "(name = %s OR alias = %s) AND enabled = %s",
            [name, name, sql.prep(ToolServer, "enabled", True)]))
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

    def __init__(self, written, opened: services.OpenedStep, future: asyncio.Future | None = None):
        self.written, self.opened, self.done = written, opened, False
        self.future = future  # the journal thread's job itself, done once the write has committed (or failed)

    def __await__(self):
        if not self.done:
            yield from self.written.__await__()
            self.done = True


class Outcomes:
    """A call's outcome, journaled on the journal thread: queued before the answer goes back to the agent
    (so it comes before anything the agent does next), and awaited before it: an agent is told only of
    what is journaled."""

    def __init__(self, journal: JournalThread):
        self.journal = journal

    def write(self, opened: services.OpenedStep, started, outcome: services.Outcome) -> Journaled:
        """Queue the outcome's journal write now and return an awaitable for it."""
        queued = self._queue(opened, started, outcome)
        return Journaled(self._written(queued, opened), opened, queued)

    def write_unawaited(self, opened: services.OpenedStep, started, outcome: services.Outcome) -> None:
        """Queue the outcome's journal write from a call that is being cancelled, so cannot wait for it; a
        failure is logged (the reconciler then marks the step), as for any outcome."""
        written = self._queue(opened, started, outcome)

        def logged(future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is not None:
                logger.error("could not journal the outcome of step %s of run %s; the reconciler will mark "
                             "it", opened.number, opened.run_id, exc_info=future.exception())

        written.add_done_callback(logged)

    def cancelled(self, opened: services.OpenedStep, started, *, sent: bool) -> None:
        """Journal that the agent cancelled the call, before or after it was sent (the server may have acted
        only once it had it), from a call being cancelled, so without waiting for the write."""
        server_name = opened.server.name
        why = (f"The agent cancelled the call while {server_name} had it; the server may have acted." if sent
               else f"The agent cancelled the call before it was sent to {server_name}; nothing was sent.")
        self.write_unawaited(opened, started, services.Outcome(may_have_acted=sent, cancelled=why))

    async def not_delivered(self, journaled: Journaled, why: str) -> None:
        """The agent went away before it had the server's answer: the step, closed as answered, says so."""
        await journaled
        try:
            await self.journal.run(services.mark_undelivered, opened=journaled.opened, message=why,
                                   now=timezone.now())
            metrics.ANSWERS_LOST.labels(journaled.opened.server.name).inc()
        except Exception:
            logger.exception("could not journal that step %s of run %s was not delivered",
                             journaled.opened.number, journaled.opened.run_id)

    def _queue(self, opened: services.OpenedStep, started, outcome: services.Outcome) -> asyncio.Future:
        """Queue the outcome's write, its pure part worked out here first (`services.prepare_close`: the
        result's JCS, the entry's payload, the values its links are looked up by), while the journal thread
        writes other calls; should that fail, the journal thread works it out itself, as it always did."""
        finished = timezone.now()
        try:
            closing = services.prepare_close(opened=opened, outcome=outcome, started=started,
                                             finished=finished)
        except Exception:  # the server acted: its outcome is journaled whatever went wrong here
            logger.exception("could not prepare the outcome of step %s of run %s", opened.number,
                             opened.run_id)
            closing = None
        return self.journal.submit(services.close_step, opened=opened, outcome=outcome, started=started,
                                   finished=finished, closing=closing)

    @staticmethod
    async def _written(written: asyncio.Future, opened: services.OpenedStep) -> None:
        """The tool server has already acted, so a database failure here must not turn its answer into an
        error (the agent would retry and act twice): the step stays `pending` in the record, and
        `journal.reconcile_stale_steps` later marks it as acted-but-unrecorded."""
        try:
            await written
        except Exception:
            logger.exception("could not journal the outcome of step %s of run %s; the reconciler will mark "
                             "it", opened.number, opened.run_id)
