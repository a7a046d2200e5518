"""What the undo capture adds to an agent's single-row UPDATE, and to a single-row SELECT, through the
Recorder (issue 45; the read's window, issue 58).

    .venv/bin/python bench/database_latency.py [--calls 200]

Starts the web app (Recorder included) on a scratch database, with the pinned mcp-server-sqlite registered
three times over stdio on three copies of one small CRM: `bare` with no pack (a call is forwarded as it
comes), `plain` with the sqlite pack and its database but no capture (each call's SQL is read against the
database first), and `captured` with the pack and the capture on `contacts` (the SQL is read, the call's
write window opened, and its rows read into the record after it). One MCP client sends a single-row UPDATE
through each, interleaved call by call, and a single-row SELECT the same way. No autonomy policy is set, so
every call goes through. Prints the median latency of each, what the capture adds to a write over `plain`
(target: at most 3 ms), and what it adds to a read (every SQL call runs in its database's window, reads
included: target at most 1 ms).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from recorder_latency import client_for, sample_stack  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / ".servers" / "mcp-server-sqlite" / "bin" / "mcp-server-sqlite"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="database-latency-"))
    with sample_stack("database-latency-", samples_port=8195, web_port=8196) as (_, user, token):
        from approver import services as approver_services
        from journal import services
        from journal.upstream import database
        from tests.journal.undo.databases import make_crm

        for name in ("bare", "plain", "captured"):
            path = make_crm(scratch / f"{name}.db", contacts=1000)
            server = services.refresh_catalogue(server=services.register_tool_server(
                name=name, command=f"{SERVER} --db-path {path}",
                database="" if name == "bare" else str(path)))
            if name != "bare":
                approver_services.use_pack(server=server, pack="sqlite", by=user)
            if name == "captured":
                database.install(str(path), ["contacts"])
        times = measure(token, args.calls, args.warmup)
        window = window_cost(str(scratch / "captured.db"), args.calls)
    for kind, target in (("write", 3), ("read", 1)):
        medians = {name: statistics.median(values) for name, values in times[kind].items()}
        what = "single-row UPDATEs" if kind == "write" else "single-row SELECTs"
        print(f"{args.calls} {what} through the Recorder, interleaved ({args.warmup} warm-up)")
        for name, words in (("bare", "no pack (forwarded as it comes)"),
                            ("plain", "the sqlite pack, no capture"),
                            ("captured", "the sqlite pack and the capture")):
            print(f"  {words:<34} median {medians[name]:7.2f} ms")
        added = medians["captured"] - medians["plain"]
        verdict = "met" if added <= target else "NOT met"
        print(f"  added by the capture: {added:.2f} ms; target at most {target} ms -> {verdict}")
        print(f"  added by reading the SQL first: {medians['plain'] - medians['bare']:.2f} ms")
    print(f"The window itself (opened and closed on a call that changed nothing, in this process): median "
          f"{window:.3f} ms")


def window_cost(place: str, calls: int) -> float:
    """A read's window, opened and read after the call, timed alone."""
    from journal.upstream import windows

    times = []
    for _ in range(calls):
        started = time.perf_counter()
        windows.closed(windows.opened(place), tables=None, keep=10_000)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(token: str, calls: int, warmup: int) -> dict[str, list[float]]:
    import anyio

    url = "http://127.0.0.1:8196/mcp/"

    async def call(client, tool: str, i: int, kind: str) -> float:
        query = (f"UPDATE contacts SET status = 's{i}' WHERE id = {i % 1000 + 1}" if kind == "write"
                 else f"SELECT status FROM contacts WHERE id = {i % 1000 + 1}")
        started = time.perf_counter()
        result = await client.call_tool(f"{tool}__{kind}_query", {"query": query})
        assert not result.is_error, result
        return (time.perf_counter() - started) * 1000

    async def main():
        times = {kind: {"bare": [], "plain": [], "captured": []} for kind in ("write", "read")}
        async with client_for(url, token) as client:
            for i in range(warmup + calls):
                for kind, by_server in times.items():
                    for name in by_server:
                        elapsed = await call(client, name, i, kind)
                        if i >= warmup:
                            by_server[name].append(elapsed)
        return times

    return anyio.run(main)


if __name__ == "__main__":
    main()
