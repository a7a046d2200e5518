"""Large answers through the Recorder: what they cost it, under the limit and over it.

    .venv/bin/python bench/large_results.py [--under-mb 30] [--over-mb 150] [--stdio]

Starts the sample tool servers and the web app (Recorder included) as separate uvicorn processes on a
scratch database, then asks the sample `legacy__blob` tool for an answer under RECORDER_MAX_RESULT_BYTES
(relayed, and stored once in the run's record) and one over it (read to its end and dropped: the agent gets
a tool error); with --stdio, the same of a tool server over stdio (tests/fixtures/slow_stdio_server.py, whose
output the Recorder reads in chunks). Prints, for each, how long the call took, how much the Recorder
process's peak memory grew,
and how long the API's step list and the run page take afterwards.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recorder_latency import client_for, sample_stack  # noqa: E402 - bench/ is not a package


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmHWM in /proc: this needs Linux")


def call_blob(url: str, token: str, size: int, tool: str):
    import anyio

    async def main():
        async with client_for(url, token) as client:
            started = time.perf_counter()
            result = await client.call_tool(tool, {"size": size})
            return time.perf_counter() - started, result

    return anyio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--under-mb", type=int, default=30)
    parser.add_argument("--over-mb", type=int, default=150)
    parser.add_argument("--stdio", action="store_true", help="ask a tool server over stdio instead")
    args = parser.parse_args()
    with sample_stack("large-results-bench-", samples_port=8192, web_port=8193) as (web, user, token):
        from django.conf import settings
        from django.contrib.auth.models import Group
        from django.test import Client as WebClient

        from journal import services
        from journal.auth import roles
        from journal.models import Step

        tool = "legacy__blob"
        if args.stdio:
            stdio_server = ROOT / "tests" / "fixtures" / "slow_stdio_server.py"
            services.refresh_catalogue(server=services.register_tool_server(
                name="big", command=f"{sys.executable} {stdio_server} /dev/null"))
            tool = "big__blob"

        user.groups.add(Group.objects.get_or_create(name=roles.ON_CALL)[0])
        web_client = WebClient()
        web_client.force_login(user)
        limit = settings.RECORDER_MAX_RESULT_BYTES
        print(f"RECORDER_MAX_RESULT_BYTES = {limit / 2**20:.0f} MiB; Recorder peak memory at start "
              f"{peak_rss_mb(web.pid):.0f} MB")
        for label, megabytes in (("over the limit", args.over_mb), ("under the limit", args.under_mb)):
            before = peak_rss_mb(web.pid)
            seconds, result = call_blob("http://127.0.0.1:8193/mcp/", token, megabytes * 2**20, tool)
            time.sleep(1)  # the journal's write of the outcome
            grew = peak_rss_mb(web.pid) - before
            step = Step.objects.order_by("-pk").first()
            outcome = (
                "tool error" if result.is_error else f"{len(result.content[0].text) / 2**20:.0f} MB relayed"
            )
            started = time.perf_counter()
            listing = web_client.get(f"/api/runs/{step.run.public_id}/steps/")
            api_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            page = web_client.get(f"/runs/{step.run.public_id}/")
            page_ms = (time.perf_counter() - started) * 1000
            print(
                f"  {megabytes} MB answer, {label}: {outcome} in {seconds:.1f} s; Recorder peak memory "
                f"+{max(grew, 0):.0f} MB; step {step.status}, stored {step.result_storage}, "
                f"{(step.result_size or 0) / 2**20:.0f} MB recorded; API step list {api_ms:.0f} ms "
                f"({len(listing.content) / 1024:.0f} KiB), run page {page_ms:.0f} ms (HTTP "
                f"{page.status_code})"
            )


if __name__ == "__main__":
    main()
