"""How much the Recorder adds to a tool call.

    .venv/bin/python bench/recorder_latency.py [--calls 1000] [--interleave] [--pass-through]

Starts the sample tool servers and the web app (Recorder included) as separate uvicorn processes on a
scratch database, then makes N calls from one MCP client to the same sample tool (`legacy__echo`): first
directly, then through the Recorder, which journals each one (the intent committed before forwarding,
the outcome committed as the answer goes back; chain entries, dependency inference). Prints median and p99
latency of each and their ratio; the target is a median
ratio of at most 2.0 (one extra hop is the floor). With --pass-through, a third kind of call, interleaved
with the other two: an MCP SDK server that relays to the same tool with the SDK's client and journals nothing
(bench/relay_floors.py's), and the Recorder's median as a multiple of its median (target: at most 1.1),
with the milliseconds each adds over direct.
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def wait(url: str) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


@contextlib.asynccontextmanager
async def client_for(url: str, token: str | None):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
            yield client


async def timed_call(client, tool: str, index: int) -> float:
    started = time.perf_counter()
    result = await client.call_tool(tool, {"i": index})
    elapsed = (time.perf_counter() - started) * 1000
    assert not result.is_error, result
    return elapsed


def measure(url: str, token: str | None, calls: int, warmup: int) -> list[float]:
    """Latencies (ms) of `calls` calls from one client, after `warmup` unmeasured ones."""
    import anyio

    tool = "legacy__echo" if token else "echo"

    async def main():
        async with client_for(url, token) as client:
            timings = [await timed_call(client, tool, index) for index in range(warmup + calls)]
        return timings[warmup:]

    return anyio.run(main)


def measure_pair(direct_url: str, recorder_url: str, token: str, calls: int, warmup: int):
    """Direct and Recorder calls interleaved one by one, so both see the same moments of a noisy machine."""
    import anyio

    async def main():
        async with client_for(direct_url, None) as direct, client_for(recorder_url, token) as through:
            pairs = [(await timed_call(direct, "echo", i), await timed_call(through, "legacy__echo", i))
                     for i in range(warmup + calls)]
        return [d for d, _ in pairs[warmup:]], [t for _, t in pairs[warmup:]]

    return anyio.run(main)


def measure_three(direct_url: str, pass_url: str, recorder_url: str, token: str, calls: int, warmup: int):
    """Direct, SDK pass-through and Recorder calls interleaved one by one (see `measure_pair`)."""
    import anyio

    async def main():
        async with client_for(direct_url, None) as direct, client_for(pass_url, "agt_floor") as passing, \
                client_for(recorder_url, token) as through:
            rows = [(await timed_call(direct, "echo", i), await timed_call(passing, "legacy__echo", i),
                     await timed_call(through, "legacy__echo", i)) for i in range(warmup + calls)]
        return [list(column) for column in zip(*rows[warmup:], strict=True)]

    return anyio.run(main)


@contextlib.contextmanager
def sample_stack(prefix: str, *, samples_port: int, web_port: int, database_url: str | None = None,
                 workers: int = 1, bus_url: str = ""):
    """The sample tool servers and the web app (Recorder included) as separate uvicorn processes on a
    scratch database (SQLite, or the empty database `database_url`), with the sample `legacy` server
    registered and an agent for a user `bench`: yields (the web app's process, the user, the agent's
    token), and stops both processes after. With `workers` > 1, the web app is that many processes on the
    Redis bus `bus_url`."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    # DEBUG off, as in production: with it on, Django also records every SQL statement it runs.
    env = {**os.environ, "VAR_DIR": str(scratch), "RECORDER_KEY_DIR": str(scratch / "keys"),
           "DJANGO_SETTINGS_MODULE": "approver.settings", "LOG_LEVEL": "WARNING", "DEBUG": "0"}
    env.pop("DATABASE_URL", None)
    if database_url:
        env["DATABASE_URL"] = database_url
    if workers > 1:
        env["RECORDER_BUS_URL"] = bus_url
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from journal import services

    call_command("migrate", verbosity=0)
    samples = subprocess.Popen(
        [sys.executable, "-m", "samples", "--port", str(samples_port)], cwd=ROOT, env=env
    )
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "approver.asgi:application",
            "--port",
            str(web_port),
            "--log-level",
            "warning",
            *(("--workers", str(workers)) if workers > 1 else ()),
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        wait(f"http://127.0.0.1:{samples_port}/legacy/ledger")
        wait(f"http://127.0.0.1:{web_port}/login/")
        services.refresh_catalogue(server=services.register_tool_server(
            name="legacy", url=f"http://127.0.0.1:{samples_port}/legacy/mcp"))
        user = User.objects.create_user("bench")
        _, token = services.create_agent(name="bench-bot", on_behalf_of=user)
        yield web, user, token
    finally:
        for process in (samples, web):
            process.terminate()
            process.wait(timeout=20)


def summary(timings: list[float]) -> tuple[float, float]:
    ordered = sorted(timings)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--server-delay-ms", type=int, default=0,
                        help="Make the sample tool take this long, like a remote API (0: answer at once).")
    parser.add_argument("--with-policy", action="store_true",
                        help="decide every call under an autonomy policy for every call (set to allow all)")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="Alternate direct and Recorder calls one by one instead of 1,000 of each in turn.",
    )
    parser.add_argument(
        "--pass-through",
        action="store_true",
        help="Also (interleaved) an MCP SDK server relaying to the tool with the SDK's client, no "
        "journal (bench/relay_floors.py's): the Recorder's target is at most 1.1x its median.",
    )
    args = parser.parse_args()

    with sample_stack("recorder-bench-", samples_port=8190, web_port=8191) as (_, user, token):
        if args.with_policy:
            from approver import policy
            from approver import services as approver_services
            from approver.models import AutonomyPolicy

            approver_services.save_policy(
                row=AutonomyPolicy(
                    name="Bench", scope="everything", decisions=dict.fromkeys(policy.CLASSES, "allow")
                ),
                by=user,
            )
        import httpx

        httpx.post(
            "http://127.0.0.1:8190/legacy/control", json={"delay_ms": args.server_delay_ms}
        ).raise_for_status()
        passing = None
        if args.pass_through:
            relay = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "relay_floors.py"), "--serve", "sdk", "--port", "8192"],
                cwd=ROOT,
                env=dict(os.environ),
            )
            try:
                wait("http://127.0.0.1:8192/")
                direct, passing, through = measure_three(
                    "http://127.0.0.1:8190/legacy/mcp",
                    "http://127.0.0.1:8192/mcp/",
                    "http://127.0.0.1:8191/mcp/",
                    token,
                    args.calls,
                    args.warmup,
                )
            finally:
                relay.terminate()
                relay.wait(timeout=20)
        elif args.interleave:
            direct, through = measure_pair(
                "http://127.0.0.1:8190/legacy/mcp",
                "http://127.0.0.1:8191/mcp/",
                token,
                args.calls,
                args.warmup,
            )
        else:
            direct = measure("http://127.0.0.1:8190/legacy/mcp", None, args.calls, args.warmup)
            through = measure("http://127.0.0.1:8191/mcp/", token, args.calls, args.warmup)
    (d_median, d_p99), (r_median, r_p99) = summary(direct), summary(through)
    delay = f", tool answering in {args.server_delay_ms} ms" if args.server_delay_ms else ""
    delay += ", under an autonomy policy" if args.with_policy else ""
    order = "interleaved" if args.interleave or args.pass_through else "one block after the other"
    print(f"{args.calls} calls to legacy echo, directly and through the Recorder, {order}"
          f" (after {args.warmup} warm-up calls{delay})")
    print(f"  direct:           median {d_median:7.2f} ms   p99 {d_p99:7.2f} ms")
    print(f"  through Recorder: median {r_median:7.2f} ms   p99 {r_p99:7.2f} ms")
    tenth = max(1, len(through) // 10)
    drift = [round(statistics.median(through[i:i + tenth]), 1) for i in range(0, len(through), tenth)]
    print(f"  through Recorder, median of each tenth of the run: {drift} ms")
    print(
        f"  ratio:            median {r_median / d_median:5.2f}x     p99 {r_p99 / d_p99:5.2f}x   (target: "
        f"median <= 2.0)"
    )
    if passing is not None:
        p_median, p_p99 = summary(passing)
        print(
            f"  SDK pass-through (no journal): median {p_median:7.2f} ms   p99 {p_p99:7.2f} ms; the Recorder "
            f"is {r_median / p_median:4.2f}x its median (target: <= 1.1x), adding {r_median - d_median:.2f} "
            f"ms over direct where the pass-through adds {p_median - d_median:.2f} ms"
        )


if __name__ == "__main__":
    main()
