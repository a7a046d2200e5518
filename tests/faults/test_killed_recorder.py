"""The Recorder's processes killed (SIGKILL) in the middle of a journal batch, while agents keep calling.

To land a kill inside a batch, the test holds one run's row locked (on SQLite, the database's write lock):
a process's journal writer takes every job waiting, writes the first ones of its group and then waits on the
lock inside the group's transaction, the agents' calls piling up behind it. Every Recorder process is killed
then, the lock let go, and uvicorn starts new ones; the agents open their sessions again and go on.

The sample server's own ledger decides, with each run's chain: nothing the server did is missing from the
journal (a call is forwarded only after the transaction holding its intent committed), nothing an agent was
answered for is missing, nothing is journaled or done twice, and each run's steps are in the order the agent
made its calls. FAULT_RUNS sets how many kills (bench/faults.py runs it at full size)."""

import collections
import os
import signal
import threading
import time

import anyio
import httpx2
import pytest
from django.db import connection, transaction
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services
from journal.models import Run, Step
from tests.journal.helpers import register_samples
from tests.journal.test_worker_processes import recorder_processes, workers_of
from tests.services import needs_redis

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

AGENTS, WORKERS = 12, 2
KILLS = int(os.environ.get("FAULT_RUNS", "2"))

# A process whose writer waits on a lock, having written a step of its group already, in this transaction.
WRITTEN_AND_WAITING = """
    SELECT count(*) FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' AND EXISTS (
        SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted AND l.mode = 'RowExclusiveLock'
        AND l.relation = 'journal_step'::regclass)
"""


class Agents:
    """The agents' calls, each titled `bot-N-K` (K counting up), and what they saw."""

    def __init__(self, tokens: dict[str, str]):
        self.tokens, self.answered, self.errors, self.stop = tokens, {}, [], False

    async def agent(self, url: str, name: str) -> None:
        n = 0
        while not self.stop:
            try:
                headers = {"Authorization": f"Bearer {self.tokens[name]}"}
                limits = httpx2.Limits(max_keepalive_connections=0)
                async with httpx2.AsyncClient(headers=headers, timeout=60, limits=limits) as http:
                    async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
                        while not self.stop:
                            n += 1
                            title = f"{name}-{n}"
                            try:
                                result = await client.call_tool("legacy__create_ticket", {"title": title},
                                                                meta={"hatp/journal": {"runId": name}})
                            except Exception as exc:  # noqa: BLE001 - what the agent saw, counted below
                                self.errors.append(f"{title}: {type(exc).__name__}")
                            else:
                                self.answered[title] = result.structured_content["ticket"]
            except Exception as exc:  # noqa: BLE001 - its session broke under it: opened again
                self.errors.append(f"{name}: session broke: {type(exc).__name__}")
                await anyio.sleep(0.1)

    def run(self, url: str) -> None:
        async def everyone():
            async with anyio.create_task_group() as group:
                for name in self.tokens:
                    group.start_soon(self.agent, url, name)

        anyio.run(everyone)


def hold_runs(run_ids: list[int], held: threading.Event, release: threading.Event) -> None:
    """Hold these runs' rows (SQLite: every write) in an open transaction until `release`."""
    try:
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(pk__in=run_ids).values_list("pk", flat=True))
            held.set()
            release.wait(timeout=60)
    finally:
        connection.close()


def batch_waits_with_writes(timeout: float) -> bool:
    """Until a Recorder process waits on the lock having written part of its group (PostgreSQL), or
    `timeout` (SQLite cannot tell: every write waits, the groups taken and held); whether it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(WRITTEN_AND_WAITING)
                if cursor.fetchone()[0]:
                    return True
        time.sleep(0.05)
    return False


def hold_until_mid_batch(runs: list[int], figures: collections.Counter):
    """Hold one of the runs until a process's group waits on it with part of it written (on PostgreSQL,
    letting go and holding the next one until it does; a group that began with the held run has written
    nothing yet, and an agent may be between sessions)."""
    tries = 60 if connection.vendor == "postgresql" else 1
    for attempt in range(tries):
        held, release = threading.Event(), threading.Event()
        run = [runs[(figures["holds"] + attempt) % len(runs)]]
        holder = threading.Thread(target=hold_runs, args=(run, held, release))
        holder.start()
        held.wait(timeout=30)
        figures["holds"] += 1
        if batch_waits_with_writes(timeout=0.5):
            figures["with writes"] += 1
            break
        if attempt < tries - 1:
            release.set()
            holder.join(timeout=30)
            time.sleep(0.2)
    return release, holder


def kill_mid_batch(agents: Agents, master: int, figures: collections.Counter) -> None:
    """KILLS times: let the agents make calls, hold an agent's run, kill every process, let go."""
    try:
        for _ in range(KILLS):
            start = len(agents.answered)
            deadline = time.monotonic() + 90
            while len(agents.answered) < start + 3 * AGENTS or len(workers_of(master)) < WORKERS:
                assert time.monotonic() < deadline, "the agents made no progress"
                time.sleep(0.05)
            # One run at a time: a group that holds it waits on nothing the test holds, so no deadlock.
            runs = list(Run.objects.filter(key__startswith="run:bot-").order_by("pk")
                        .values_list("pk", flat=True))
            release, holder = hold_until_mid_batch(runs, figures)
            for victim in workers_of(master):
                os.kill(victim, signal.SIGKILL)
            figures["kills"] += 1
            release.set()
            holder.join(timeout=30)
        deadline = time.monotonic() + 90
        start = len(agents.answered)
        while len(agents.answered) < start + 3 * AGENTS:  # the new processes serve everyone again
            assert time.monotonic() < deadline, "the agents made no progress after the last kill"
            time.sleep(0.05)
    finally:
        agents.stop = True
        connection.close()


@needs_redis
def test_killing_the_recorder_in_the_middle_of_a_journal_batch_loses_repeats_and_reorders_nothing(
        sample_servers, dana, tmp_path):
    register_samples(sample_servers, names=("legacy",))
    agents = Agents({f"bot-{n}": services.create_agent(name=f"bot-{n}", on_behalf_of=dana)[1]
                     for n in range(AGENTS)})
    figures = collections.Counter()
    with open(tmp_path / "workers.log", "w") as log, recorder_processes(WORKERS, log) as (url, master):
        killer = threading.Thread(target=kill_mid_batch, args=(agents, master, figures))
        killer.start()
        agents.run(url)
        killer.join(timeout=120)
    assert figures["kills"] == KILLS

    ledger = sample_servers.ledger("legacy")
    done = collections.Counter(e["title"] for e in ledger if e["op"] == "create_ticket")
    steps = list(
        Step.objects.filter(tool="create_ticket").values_list("run__key", "number", "status", "arguments")
    )
    journaled = collections.Counter(arguments["title"] for _, _, _, arguments in steps)
    status = {arguments["title"]: state for _, _, state, arguments in steps}
    # An answer goes back only once its outcome has committed: every answered call is journaled ok.
    lost = len(set(done) - set(journaled)) + sum(status.get(title) != "ok" for title in agents.answered)
    twice = sum(n > 1 for n in done.values()) + sum(n > 1 for n in journaled.values())
    out_of_order = 0
    for run in Run.objects.filter(key__startswith="run:bot-"):
        numbers = sorted((number, int(arguments["title"].rsplit("-", 1)[1]))
                         for key, number, _, arguments in steps if key == run.key)
        out_of_order += sum(a[1] >= b[1] for a, b in zip(numbers, numbers[1:], strict=False))
        seqs = list(run.entries.order_by("seq").values_list("seq", flat=True))
        out_of_order += seqs != list(range(1, run.head_seq + 1))
        assert services.verify_run(run=run).ok, run
    written = (f"{figures['with writes']} with part of the group written, in {figures['holds']} holds"
               if connection.vendor == "postgresql"
               else "SQLite: each group taken and waiting for the write lock")
    print(f"\nkilled-recorder faults ({connection.vendor}): {figures['kills']} kills of every Recorder "
          f"process in the middle of a journal group ({written}), {len(journaled)} calls "
          f"journaled, {len(agents.answered)} answered: "
          f"{lost} lost, {twice} twice, {out_of_order} out of order")
    assert (lost, twice, out_of_order) == (0, 0, 0)
    assert len(agents.answered) >= 3 * AGENTS * (KILLS + 1)
    if connection.vendor == "postgresql":
        # A kill landed inside a group already partly written (most do: the rest had none such to hand
        # within the holds tried, and landed in a group that waited before its first write).
        assert figures["with writes"] >= 1
