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
with the milliseconds each adds over direct. With --observability too, two more Recorder processes on the
same database, interleaved with the others: one counting metrics (`METRICS=on`; the first Recorder has
them off) and one also tracing every call to an OTLP receiver at a 100 % sample; the figure each adds
(targets: at most 5 % with metrics, 15 % with tracing).
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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
async def client_for(url: str, token: str | None, run_id: str | None = None):
    """An MCP client of `url` with the agent's token, its calls a run of their own when `run_id` is given."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if run_id:
        headers["Hatp-Run-Id"] = run_id
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


def measure_three(direct_url: str, pass_url: str, recorder_url: str, token: str, calls: int, warmup: int,
                  more: tuple[str, ...] = ()):
    """Direct, SDK pass-through and Recorder calls (and calls to the Recorders at `more`) interleaved one by
    one (see `measure_pair`): a list of timings per kind, in that order."""
    import anyio

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            clients = [(await stack.enter_async_context(client_for(direct_url, None)), "echo"),
                       (await stack.enter_async_context(client_for(pass_url, "agt_floor")), "legacy__echo"),
                       *[(await stack.enter_async_context(client_for(url, token)), "legacy__echo")
                         for url in (recorder_url, *more)]]
            rows = [[await timed_call(client, tool, i) for client, tool in clients]
                    for i in range(warmup + calls)]
        return [list(column) for column in zip(*rows[warmup:], strict=True)]

    return anyio.run(main)


@contextlib.contextmanager
def sample_stack(prefix: str, *, samples_port: int, web_port: int, database_url: str | None = None,
                 workers: int = 1, bus_url: str = "", web_env: dict | None = None,
                 more_webs: tuple[tuple[int, dict], ...] = ()):
    """The sample tool servers and the web app (Recorder included) as separate uvicorn processes on a
    scratch database (SQLite, or the empty database `database_url`), with the sample `legacy` server
    registered and an agent for a user `bench`: yields (the web app's process, the user, the agent's
    token), and stops both processes after. With `workers` > 1, the web app is that many processes on the
    Redis bus `bus_url`. `web_env` is added to the web app's environment; `more_webs` are (port, environment
    added) of further web app processes on the same database."""
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
    webs = [subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "approver.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *(("--workers", str(workers)) if workers > 1 else ()),
        ],
        cwd=ROOT,
        env={**env, **added},
    ) for port, added in ((web_port, web_env or {}), *more_webs)]
    web = webs[0]
    try:
        wait(f"http://127.0.0.1:{samples_port}/legacy/ledger")
        for port, _ in ((web_port, {}), *more_webs):
            wait(f"http://127.0.0.1:{port}/login/")
        services.refresh_catalogue(server=services.register_tool_server(
            name="legacy", url=f"http://127.0.0.1:{samples_port}/legacy/mcp"))
        user = User.objects.create_user("bench")
        _, token = services.create_agent(name="bench-bot", on_behalf_of=user)
        yield web, user, token
    finally:
        for process in (samples, *webs):
            process.terminate()
            process.wait(timeout=20)


class OtlpSink:
    """An OTLP/HTTP endpoint that takes every export and keeps only its size, as a collector on another
    host would cost the Recorder nothing but the sending."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.exports, self.bytes = 0, 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                sink.bytes += len(self.rfile.read(int(self.headers["Content-Length"])))
                sink.exports += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.server.server_port}",
                "OTEL_TRACES_SAMPLER": "always_on", "OTEL_SERVICE_NAME": "recorder-bench"}


def report_observability(d_median: float, plain: float, more: list[list[float]], collector: OtlpSink) -> None:
    """What metrics, then metrics and tracing, add to the Recorder's median (interleaved in the same run)."""
    (m_median, _), (t_median, _) = summary(more[0]), summary(more[1])
    added = [100 * (m_median / plain - 1), 100 * (t_median / plain - 1)]
    print(f"  Recorder, metrics off, no tracing: median {plain:7.2f} ms "
          f"({plain - d_median:.2f} ms over direct)")
    print(f"  Recorder with metrics:             median {m_median:7.2f} ms, {added[0]:+5.1f} % "
          "(target: <= 5 %)")
    print(f"  Recorder with metrics and tracing: median {t_median:7.2f} ms, {added[1]:+5.1f} % "
          f"(target: <= 15 %); {collector.exports} exports, {collector.bytes / 1e6:.1f} MB of spans received")


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
    parser.add_argument(
        "--observability",
        action="store_true",
        help="With --pass-through: the first Recorder with metrics off, and two more, one counting metrics "
        "and one also tracing every call (targets: at most 5 %% and 15 %% added).",
    )
    args = parser.parse_args()
    observed = args.observability and args.pass_through
    collector = OtlpSink() if observed else None
    web_env = {"METRICS": "off"} if observed else None
    more_webs = ((8197, {"METRICS": "on"}), (8198, {"METRICS": "on", **collector.env()})) if observed else ()

    with sample_stack("recorder-bench-", samples_port=8190, web_port=8191, web_env=web_env,
                      more_webs=more_webs) as (_, user, token):
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
                direct, passing, through, *more = measure_three(
                    "http://127.0.0.1:8190/legacy/mcp",
                    "http://127.0.0.1:8192/mcp/",
                    "http://127.0.0.1:8191/mcp/",
                    token,
                    args.calls,
                    args.warmup,
                    more=tuple(f"http://127.0.0.1:{port}/mcp/" for port, _ in more_webs),
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
    if observed:
        report_observability(d_median, r_median, more, collector)


if __name__ == "__main__":
    main()
