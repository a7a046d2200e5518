"""The Recorder as several uvicorn worker processes, as in production, on the test's database (SQLite's file,
and PostgreSQL in the second pass) and a Redis bus: agents on the handshake and on the stateless protocol
call at once, every request on a new connection (so any worker gets any request), and a held call is
approved while its request waits. Every call is journaled once, every run's chain is gapless and verifies,
and the server acted once per call. (`bench/processes.py` runs it at full size.)"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services
from journal.models import Run, Step
from tests.conftest import free_port
from tests.services import REDIS_URL, needs_redis, worker_env_for_test_database

from ..approver.services.test_held_calls import EMAIL, decide, held, set_policy
from .helpers import register_samples

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

AGENTS, CALLS = 6, 15  # half of them on each protocol


@contextlib.contextmanager
def recorder_processes(workers: int, log):
    port = free_port()
    env = {**worker_env_for_test_database(), "RECORDER_BUS_URL": REDIS_URL, "LOG_LEVEL": "INFO"}
    env.pop("REDIS_URL", None)
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "approver.asgi:application",
            "--workers",
            str(workers),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(f"http://127.0.0.1:{port}/login/", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError("the Recorder's processes did not start")
        yield f"http://127.0.0.1:{port}/mcp/", web.pid
    finally:
        web.terminate()
        web.wait(timeout=30)


async def agent_calls(url: str, token: str, mode: str, name: str, calls: int) -> list:
    # No connection is kept alive: each request is a new connection, which any worker may accept.
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                  limits=httpx2.Limits(max_keepalive_connections=0)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
            return [
                (await client.call_tool("legacy__create_ticket", {"title": f"{name}-{n}"})).structured_content
                for n in range(calls)
            ]


@needs_redis
def test_workers_serve_any_request_of_any_session_and_journal_every_call_once(
        sample_servers, dana, admin_user, approver_user, tmp_path, monkeypatch):
    from approver import tasks

    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    register_samples(sample_servers, names=("legacy", "mail"))
    set_policy(admin_user, unknown="allow")  # sending an email (it cannot be undone) asks a person first
    agents = [
        (
            f"bot-{n}",
            services.create_agent(name=f"bot-{n}", on_behalf_of=dana)[1],
            "legacy" if n % 2 else "auto",
        )
        for n in range(AGENTS)
    ]
    _, mailer = services.create_agent(name="mailer", on_behalf_of=dana)
    log_path = tmp_path / "workers.log"
    with open(log_path, "w") as log, recorder_processes(3, log) as (url, _):
        mailed = {}

        async def send_mail():
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {mailer}"}, timeout=60,
                                          limits=httpx2.Limits(max_keepalive_connections=0)) as http:
                async with Client(
                    streamable_http_client(url, http_client=http), mode="legacy", cache=None
                ) as client:
                    mailed["result"] = await client.call_tool("mail__send_email", EMAIL)

        mail = threading.Thread(target=anyio.run, args=(send_mail,))
        mail.start()

        async def everyone():
            answers = {}

            async def one(name, token, mode):
                answers[name] = await agent_calls(url, token, mode, name, CALLS)

            async with anyio.create_task_group() as group:
                for name, token, mode in agents:
                    group.start_soon(one, name, token, mode)
            return answers

        answers = anyio.run(everyone)
        decide(held(), approver_user, "approve")  # pressed while the request waits, in whichever worker
        mail.join(timeout=60)
    assert not mailed["result"].is_error
    assert [e["op"] for e in sample_servers.ledger("mail")].count("send_email") == 1
    for name, _, _ in agents:
        assert [answer["ticket"].startswith("T-") for answer in answers[name]] == [True] * CALLS
    tickets = [e for e in sample_servers.ledger("legacy") if e["op"] == "create_ticket"]
    assert len(tickets) == AGENTS * CALLS  # the server acted once per call
    steps = Step.objects.filter(tool="create_ticket")
    assert steps.count() == AGENTS * CALLS and set(steps.values_list("status", flat=True)) == {"ok"}
    for run in Run.objects.all():
        assert list(run.entries.order_by("seq").values_list("seq", flat=True)) == list(
            range(1, run.head_seq + 1)
        )
        assert services.verify_run(run=run).ok, run
    # A handshake session was served by more than the worker that opened it.
    assert "opened by another process" in log_path.read_text()


def workers_of(master: int) -> list[int]:
    """uvicorn's worker processes (not multiprocessing's resource tracker)."""
    found = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if "spawn_main" in _cmdline(pid)]


def _cmdline(pid: str) -> str:
    """A process's command line; "" for one that ended since it was listed (uvicorn replacing a worker)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@needs_redis
def test_a_killed_worker_costs_only_the_requests_it_held_and_nothing_is_journaled_twice(
        sample_servers, dana, tmp_path):
    """One worker is killed (SIGKILL) a third of the way through and uvicorn starts another: the agents
    whose requests it held see an error for those only (and open their session again), every other call
    goes through, and every call the server acted on is journaled exactly once (a call the dead worker had
    in hand, or had answered but not yet committed, stays `pending` for the reconciler, never doubled)."""
    register_samples(sample_servers, names=("legacy",))
    agents = [
        (
            f"bot-{n}",
            services.create_agent(name=f"bot-{n}", on_behalf_of=dana)[1],
            "legacy" if n % 2 else "auto",
        )
        for n in range(AGENTS)
    ]
    errors, answered, done = [], [], [0]

    async def agent(name, token, mode):
        n = 0
        while n < CALLS * 2:
            try:
                async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                              limits=httpx2.Limits(max_keepalive_connections=0)) as http:
                    async with Client(
                        streamable_http_client(url, http_client=http), mode=mode, cache=None
                    ) as client:
                        while n < CALLS * 2:
                            n += 1
                            done[0] += 1
                            try:
                                result = await client.call_tool(
                                    "legacy__create_ticket", {"title": f"{name}-{n}"}
                                )
                                answered.append(result.structured_content["ticket"])
                            except Exception as exc:  # noqa: BLE001 - what the agent saw, asserted on below
                                errors.append(f"{name}: {type(exc).__name__}")
            except Exception as exc:  # noqa: BLE001 - its session broke under it: opened again
                errors.append(f"{name}: session broke: {type(exc).__name__}")

    killed = []

    def kill_one(master):
        while done[0] < AGENTS * CALLS * 2 // 3:
            time.sleep(0.02)
        victim = workers_of(master)[0]
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)

    with open(tmp_path / "workers.log", "w") as log, recorder_processes(3, log) as (url, master):
        killer = threading.Thread(target=kill_one, args=(master,))
        killer.start()

        async def everyone():
            async with anyio.create_task_group() as group:
                for name, token, mode in agents:
                    group.start_soon(agent, name, token, mode)

        anyio.run(everyone)
        killer.join(timeout=60)
        time.sleep(1)  # the surviving workers' last journal writes
    assert killed
    assert len(errors) <= AGENTS, errors  # at most the one request each agent had in flight
    tickets = {e["ticket"] for e in sample_servers.ledger("legacy") if e["op"] == "create_ticket"}
    steps = Step.objects.filter(tool="create_ticket")
    ok = set(steps.filter(status="ok").values_list("result__structuredContent__ticket", flat=True))
    pending = steps.filter(status="pending").count()
    # An answer goes back only once its outcome has committed: every answered call is journaled ok. A call
    # the dead worker had in hand stays `pending` (its intent is journaled; the reconciler marks it "may have
    # acted"), and one it answered as it died may be journaled ok though the agent saw an error instead.
    assert set(answered) <= ok and len(ok - set(answered)) <= len(errors)
    assert len(answered) >= AGENTS * CALLS * 2 - AGENTS
    assert steps.count() == len(ok) + pending and pending <= AGENTS
    assert ok <= tickets and len(tickets) <= len(ok) + pending  # acted once per journaled call, never twice
    for run in Run.objects.all():
        assert list(run.entries.order_by("seq").values_list("seq", flat=True)) == list(
            range(1, run.head_seq + 1)
        )
        assert services.verify_run(run=run).ok, run
