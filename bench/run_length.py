"""Whether a call costs the same at step 10 and at step 10,000 of one run.

    .venv/bin/python bench/run_length.py [--calls 10000]

Starts the sample tool servers and the web app (Recorder included) as separate uvicorn processes on a
scratch database, then makes N calls in one run (the agent's `runId`) from a 2026-07-28 client to the
sample `legacy__echo` tool, each sending a distinctive value of its own and two that every call sends
("Asia/Tokyo", "12:00"), which every earlier result therefore contains: the case that once made dependency
inference quadratic in the run's length. Prints the median latency of the calls just after step 10 and of
the last ones, their ratio (target: within 10%), and the most inferred links any step got.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recorder_latency import client_for, sample_stack  # noqa: E402 - bench/ is not a package

WINDOW = 200


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    args = parser.parse_args()
    with sample_stack("run-length-bench-", samples_port=8194, web_port=8195) as (web, _, token):
        import anyio
        from django.db.models import Count

        from journal.models import Run, Step, StepDependency

        rss = {}

        async def main_loop() -> list[float]:
            timings = []
            meta = {"hatp/journal": {"runId": "long"}}
            async with client_for("http://127.0.0.1:8195/mcp/", token) as client:
                for index in range(args.calls):
                    started = time.perf_counter()
                    result = await client.call_tool("legacy__echo", {
                        "ref": f"ticket-{index:06d}", "zone": "Asia/Tokyo", "at": "12:00"}, meta=meta)
                    timings.append((time.perf_counter() - started) * 1000)
                    assert not result.is_error, result
                    if index in (10, args.calls - 1):
                        rss[index] = resident_mb(web.pid)
            return timings

        timings = anyio.run(main_loop)
        time.sleep(1)  # the journal's last writes
        run = Run.objects.get(key="run:long")
        early = statistics.median(timings[10:10 + WINDOW])
        late = statistics.median(timings[-WINDOW:])
        links = StepDependency.objects.filter(step__run=run).values("step").annotate(n=Count("id"))
        most = max((row["n"] for row in links), default=0)
        print(f"{args.calls} calls in one run ({Step.objects.filter(run=run).count()} steps journaled)")
        print(
            f"  median latency, steps 10-{10 + WINDOW}: {early:.2f} ms; last {WINDOW} steps: {late:.2f} ms; "
            f"ratio {late / early:.2f}x (target: within 10%)"
        )
        print(f"  Recorder's resident memory at step 10: {rss[10]:.0f} MB; at the last step: "
              f"{rss[args.calls - 1]:.0f} MB")
        print(
            f"  inferred links: {StepDependency.objects.filter(step__run=run).count()} in all, at most "
            f"{most} "
            "for one step"
        )


if __name__ == "__main__":
    main()
