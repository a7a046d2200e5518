"""Where a Recorder process spends its time on the hot path: a flame summary from py-spy.

    .venv/bin/python bench/profile_recorder.py [--calls 3000] [--sessions 1] [--postgres URL] [--top 30]
                                               [--cpu-only]

Starts the stack of bench/recorder_latency.py (the sample tool servers and one Recorder process, on a
scratch SQLite database, or with --postgres a scratch database on that server), then makes N calls to the
sample `legacy__echo` tool through the Recorder from S sessions at once while py-spy samples the Recorder's
process at 500 samples a second, keeping those of the thread holding the GIL (the process's Python work;
waiting on a socket, a lock or the database's own work in C without the GIL is left out). Prints the share
of the samples in each function, inclusive (the function and what it called) and its own, the hottest
first, and the share of each part of the path (the ASGI request, the policy and the journal's own Python,
the statements, the upstream call), so two versions of the code can be compared in one line each. First,
the CPU time the Recorder's process used a call (every thread's, from /proc; with --cpu-only, without
py-spy's pauses and nothing else): what a change of the hot path's Python is measured by.
"""

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recorder_latency import client_for, sample_stack  # noqa: E402
from sessions import scratch_postgres  # noqa: E402

# The parts of a call, by the first of their functions found in a sample's stack (innermost first).
PARTS = (
    ("database driver (statements, commits)", ("sqlite3", "psycopg", "execute", "commit", "executemany")),
    ("JSON and canonical bytes", ("canonical.py", "json/", "orjson", "strict_json")),
    ("journal services (steps, record, links)", ("journal/services/", "journal/record/",
                                                 "journal/undo/")),
    ("journal thread (grouping, hand-over)", ("journal_thread.py",)),
    ("upstream client (httpx, the MCP client)", ("journal/upstream/", "httpx", "httpcore", "aiohttp")),
    ("Recorder (gateway, fast path, policy)", ("journal/mcp/", "approver/")),
    ("ASGI server and event loop", ("uvicorn", "asyncio", "anyio", "starlette", "h11", "httptools")),
)


def parse_raw(path: Path) -> tuple[collections.Counter, collections.Counter, collections.Counter, int]:
    """Inclusive and self samples per function, samples per part, and the total, from py-spy's raw output
    (one line a distinct stack: the frames outermost first, separated by `;`, then the count)."""
    inclusive, own, parts = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = stack.split(";")[1:]  # the first is the thread
        total += samples
        for frame in set(frames):
            inclusive[frame] += samples
        if frames:
            own[frames[-1]] += samples
        parts[_part(frames)] += samples
    return inclusive, own, parts, total


def _part(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, marks in PARTS:
            if any(mark in frame for mark in marks):
                return name
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--postgres", metavar="URL")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--cpu-only", action="store_true",
                        help="no py-spy: only the Recorder process's CPU time a call (all its threads)")
    args = parser.parse_args()
    raw = Path(tempfile.mkdtemp(prefix="profile-recorder-")) / "samples.txt"
    with scratch_postgres(args.postgres) as database_url, sample_stack(
            "profile-recorder-", samples_port=8190, web_port=8191,
            database_url=database_url) as (web, _, token):
        calling(token, sessions=args.sessions, calls=20)  # warm
        if not args.cpu_only:
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                    str(web.pid), "--format", "raw", "--rate", "500", "--gil", "--output",
                                    str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attached
        cpu, started = cpu_seconds(web.pid), time.perf_counter()
        calling(token, sessions=args.sessions, calls=args.calls)
        seconds, cpu = time.perf_counter() - started, cpu_seconds(web.pid) - cpu
        if not args.cpu_only:
            spy.send_signal(2)  # SIGINT: py-spy writes what it has and stops
            spy.wait(timeout=60)
    where = "PostgreSQL" if database_url else "SQLite"
    print(f"{args.calls} calls from {args.sessions} session(s) in {seconds:.1f} s "
          f"({args.calls / seconds:.0f} calls/s) on {where}; the Recorder process used "
          f"{cpu / args.calls * 1000:.2f} ms of CPU a call{' (under py-spy)' if not args.cpu_only else ''}")
    if args.cpu_only:
        return
    inclusive, own, parts, total = parse_raw(raw)
    print(f"{total} samples of Python work, {total / 500 / args.calls * 1000:.2f} ms a call")
    print(f"(py-spy's samples: {raw})")
    print("By part of the path (the innermost frame's):")
    for name, samples in parts.most_common():
        print(f"  {100 * samples / total:5.1f} %  {name}")
    print(f"Inclusive (top {args.top}):")
    for frame, samples in inclusive.most_common(args.top):
        print(f"  {100 * samples / total:5.1f} %  {frame[:150]}")
    print(f"Own (top {args.top}):")
    for frame, samples in own.most_common(args.top):
        print(f"  {100 * samples / total:5.1f} %  {frame[:150]}")


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, every thread) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calling(token: str, *, sessions: int, calls: int) -> None:
    """`calls` calls to the Recorder, shared among `sessions` sessions calling back to back."""
    import anyio

    left = [calls]
    lock = threading.Lock()

    async def session():
        async with client_for("http://127.0.0.1:8191/mcp/", token) as client:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                result = await client.call_tool("legacy__echo", {"i": left[0]})
                assert not result.is_error, result

    async def main():
        async with anyio.create_task_group() as group:
            for _ in range(sessions):
                group.start_soon(session)

    anyio.run(main)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
