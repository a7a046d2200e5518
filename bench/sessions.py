"""Calls per second with many agents at once: directly, through an SDK pass-through, through one Recorder.

    .venv/bin/python bench/sessions.py [--sessions 20] [--seconds 10] [--rounds 3] [--postgres URL]
        [--workers 3 [--redis-url redis://localhost:6379/13]]

Starts the sample tool servers, the web app (one uvicorn process, Recorder included) and the SDK
pass-through gateway of bench/relay_floors.py (the `mcp` lowlevel server in front of a `ClientSession`,
no journal), as recorder_latency.py does; then, from one client process, N sessions each call the sample
`echo` tool one call after the other for S seconds, against each of the three in turn, for R rounds (so
all three see the same moments of a noisy machine). Prints each one's calls per second (the median of the
rounds) and the Recorder's as a multiple of the pass-through's (target: at least 0.9x). On SQLite by
default; with --postgres, on a scratch database of that server (created, and dropped after). With
--workers N, the Recorder is N uvicorn processes on one port and a Redis bus, and the figure per process is
printed too.
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recorder_latency import client_for, sample_stack, wait  # noqa: E402

SCRATCH_DB = "bench_sessions"


def throughput(url: str, token: str | None, tool: str, *, sessions: int, seconds: float) -> float:
    """Calls per second of `sessions` clients calling `tool` back to back for `seconds`."""
    import anyio

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client_for(url, token)) for _ in range(sessions)]
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
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to run the Recorder on")
    parser.add_argument("--workers", type=int, default=1, help="Recorder processes (uvicorn --workers)")
    parser.add_argument("--redis-url", default="redis://localhost:6379/13", help="their bus, with --workers")
    args = parser.parse_args()
    with scratch_postgres(args.postgres) as database_url, sample_stack(
            "sessions-bench-", samples_port=8190, web_port=8191, database_url=database_url,
            workers=args.workers, bus_url=args.redis_url) as (_, _, token):
        relay = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "relay_floors.py"), "--serve", "sdk", "--port", "8192"],
            cwd=ROOT, env=dict(os.environ))
        try:
            wait("http://127.0.0.1:8192/")
            targets = {"direct": ("http://127.0.0.1:8190/legacy/mcp", None, "echo"),
                       "SDK pass-through": ("http://127.0.0.1:8192/mcp/", "agt_floor", "legacy__echo"),
                       "Recorder": ("http://127.0.0.1:8191/mcp/", token, "legacy__echo")}
            figures: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(args.rounds):
                for name, (url, bearer, tool) in targets.items():
                    figures[name].append(throughput(url, bearer, tool, sessions=args.sessions,
                                                    seconds=args.seconds))
        finally:
            relay.terminate()
            relay.wait(timeout=20)
    database = "PostgreSQL" if args.postgres else "SQLite"
    processes = "one Recorder process" if args.workers == 1 else f"{args.workers} Recorder processes"
    print(f"{args.sessions} sessions calling legacy echo back to back, {args.rounds} rounds of "
          f"{args.seconds:g} s each, {processes} on {database}")
    medians = {name: statistics.median(values) for name, values in figures.items()}
    for name, values in figures.items():
        rounds = ", ".join(f"{value:.0f}" for value in values)
        print(f"  {name:<17} {medians[name]:7.1f} calls/s   (rounds: {rounds})")
    ratio = medians["Recorder"] / medians["SDK pass-through"]
    print(f"  the Recorder: {ratio:.2f}x the pass-through's calls per second (target: at least 0.9x)")
    if args.workers > 1:
        print(f"  per Recorder process: {medians['Recorder'] / args.workers:.1f} calls/s")


if __name__ == "__main__":
    main()
