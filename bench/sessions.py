"""Calls per second with many agents at once: directly, through an SDK pass-through, through one Recorder.

    .venv/bin/python bench/sessions.py [--sessions 20] [--seconds 10] [--rounds 3] [--postgres URL]
        [--workers 1,2,3 [--redis-url redis://localhost:6379/13]] [--shared-run] [--also NAME=VALUE]

Starts the sample tool servers, the web app (one uvicorn process, Recorder included) and the SDK
pass-through gateway of bench/relay_floors.py (the `mcp` lowlevel server in front of a `ClientSession`,
no journal), as recorder_latency.py does; then, from one client process, N sessions each call the sample
`echo` tool one call after the other for S seconds, against each of the three in turn, for R rounds (so
all three see the same moments of a noisy machine). Prints each one's calls per second (the median of the
rounds) and the Recorder's as a multiple of the pass-through's (target: at least 0.9x). On SQLite by
default; with --postgres, on a scratch database of that server (created, and dropped after). With
--workers N, the Recorder is N uvicorn processes on one port and a Redis bus, and the figure per process is
printed too; with a list (`--workers 1,2,3`), the whole stack is started once for each count, and the
Recorder's calls per second for each are printed against N times the one process's figure (linear). Each
session is its own run, as each agent's task is (it sends its own `Hatp-Run-Id`); `--shared-run` makes all
of them one run, which queues every call on that run's row lock. `--also NAME=VALUE` starts a second Recorder
process on the same database with that setting changed, and measures it in each round too, so a change is
compared with what it changes on the same moments of the machine (`--also RECORDER_ONE_STATEMENT=off`).
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recorder_latency import client_for, sample_stack, wait  # noqa: E402

SCRATCH_DB = "bench_sessions"


def throughput(url: str, token: str | None, tool: str, *, sessions: int, seconds: float,
               keyed: bool = False) -> float:
    """Calls per second of `sessions` clients calling `tool` back to back for `seconds`; with `keyed`, each
    client's calls are a run of their own (a run id header per client)."""
    import anyio

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_for(
                url, token, run_id=f"bench-{uuid.uuid4()}" if keyed else None)) for _ in range(sessions)]
            for client in clients:
                await client.call_tool(tool, {"i": 0})  # every session open and warm before the clock starts
            done = [0] * sessions
            stop = time.perf_counter() + seconds

            async def calling(index, client):
                while time.perf_counter() < stop:
                    result = await client.call_tool(tool, {"i": done[index]})
                    assert not result.is_error, result
                    done[index] += 1

            started = time.perf_counter()
            async with anyio.create_task_group() as group:
                for index, client in enumerate(clients):
                    group.start_soon(calling, index, client)
            return sum(done) / (time.perf_counter() - started)

    return anyio.run(main)


@contextlib.contextmanager
def scratch_postgres(url: str | None):
    """DATABASE_URL for the stack: a fresh database on the server of `url`, dropped after (None: SQLite)."""
    if url is None:
        yield None
        return
    import psycopg

    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")
        connection.execute(f"CREATE DATABASE {SCRATCH_DB}")
    try:
        yield urlunsplit(parts._replace(path=f"/{SCRATCH_DB}"))
    finally:
        from django.conf import settings
        from django.db import connections

        if settings.configured:  # this process's own connections to it (a child's end with the child)
            connections.close_all()
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to run the Recorder on")
    parser.add_argument("--workers", default="1",
                        help="Recorder processes (uvicorn --workers), or a list of counts to compare: 1,2,3")
    parser.add_argument("--redis-url", default="redis://localhost:6379/13", help="their bus, with --workers")
    parser.add_argument("--shared-run", action="store_true", help="every session's calls in one run")
    parser.add_argument("--also", metavar="NAME=VALUE",
                        help="a second Recorder with this setting, measured in each round too")
    args = parser.parse_args()
    counts = [int(count) for count in args.workers.split(",")]
    if len(counts) == 1:
        one_stack(args, counts[0], pass_through=True)
        return
    figures = {count: one_stack(args, count, pass_through=False) for count in counts}
    base = figures[counts[0]] / counts[0]
    print(f"Scale-out on {'PostgreSQL' if args.postgres else 'SQLite'}, {os.cpu_count()} cores "
          f"(the client, the tool server and the database share them):")
    for count, figure in figures.items():
        print(f"  {count} Recorder process{'es' if count > 1 else ''}: {figure:7.1f} calls/s, "
              f"{figure / (base * count):.2f} of linear ({base * count:.0f})")


def one_stack(args, workers: int, *, pass_through: bool) -> float:
    """Start the stack with `workers` Recorder processes, measure, print; the Recorder's calls per second
    (the median of the rounds)."""
    keyed = not args.shared_run
    also = dict([args.also.split("=", 1)]) if args.also and pass_through else {}
    with scratch_postgres(args.postgres) as database_url, sample_stack(
            "sessions-bench-", samples_port=8190, web_port=8191, database_url=database_url,
            workers=workers, bus_url=args.redis_url,
            more_webs=((8194, also),) if also else ()) as (_, _, token):
        relay = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "relay_floors.py"), "--serve", "sdk", "--port", "8192"],
            cwd=ROOT, env=dict(os.environ)) if pass_through else None
        try:
            targets = {"Recorder": ("http://127.0.0.1:8191/mcp/", token, "legacy__echo")}
            if relay is not None:
                wait("http://127.0.0.1:8192/")
                targets = {"direct": ("http://127.0.0.1:8190/legacy/mcp", None, "echo"),
                           "SDK pass-through": ("http://127.0.0.1:8192/mcp/", "agt_floor", "legacy__echo"),
                           **targets}
            if also:
                targets[f"Recorder, {args.also}"] = ("http://127.0.0.1:8194/mcp/", token, "legacy__echo")
            figures: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(args.rounds):
                for name, (url, bearer, tool) in targets.items():
                    figures[name].append(throughput(url, bearer, tool, sessions=args.sessions,
                                                    seconds=args.seconds, keyed=keyed and bearer == token))
        finally:
            if relay is not None:
                relay.terminate()
                relay.wait(timeout=20)
    database = "PostgreSQL" if args.postgres else "SQLite"
    processes = "one Recorder process" if workers == 1 else f"{workers} Recorder processes"
    runs = "one run" if args.shared_run else "each its own run"
    print(f"{args.sessions} sessions ({runs}) calling legacy echo back to back, {args.rounds} rounds of "
          f"{args.seconds:g} s each, {processes} on {database}")
    medians = {name: statistics.median(values) for name, values in figures.items()}
    width = max(len(name) for name in figures)
    for name, values in figures.items():
        rounds = ", ".join(f"{value:.0f}" for value in values)
        print(f"  {name:<{width}} {medians[name]:7.1f} calls/s   (rounds: {rounds})")
    if pass_through:
        for name in (name for name in medians if name.startswith("Recorder")):
            ratio = medians[name] / medians["SDK pass-through"]
            print(f"  {name}: {ratio:.2f}x the pass-through's calls per second (target: at least 0.85x)")
    if workers > 1:
        print(f"  per Recorder process: {medians['Recorder'] / workers:.1f} calls/s")
    return medians["Recorder"]


if __name__ == "__main__":
    main()
