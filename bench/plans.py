"""What reversal plans cost: building, rendering and checking.

    .venv/bin/python bench/plans.py [--steps 10000] [--check-items 500] [--delay-ms 20] [--server-processes 3]

On a scratch SQLite database, prints:
1. the time and the number of queries to ask for a plan from step 1 of a 10,000-step run (the web request)
   and to draft it (the worker's part), journaled through the real services: compensable CRM updates, reads
   and e-mails;
2. the number of queries to render the plan page for a plan of 10 items and of 1,000 (target: equal);
3. the time to check 500 items against the sample CRM answering every call in 20 ms, concurrently (at most
   PLAN_CHECKS_PER_SERVER at a time) and one at a time (target: at least 50 times faster), with the CRM as
   one process and then as `--server-processes` processes (a tool server on cores of its own, as a real one
   is: on one machine, the checker and the server otherwise share its cores).
"""

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django(scratch: Path) -> None:
    os.environ.update({"VAR_DIR": str(scratch), "RECORDER_KEY_DIR": str(scratch / "keys"),
                       "DJANGO_SETTINGS_MODULE": "approver.settings", "DEBUG": "0", "LOG_LEVEL": "WARNING",
                       "CELERY_TASK_ALWAYS_EAGER": "0"})
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def crm_catalogue() -> list[dict]:
    undo = {"kind": "compensate", "window": "P7D", "via": "api"}
    return [
        {"name": "update_deal", "inputSchema": {"type": "object"}, "_meta": {"hatp/journal": {"undo": undo}}},
        {"name": "get_deal", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "send_email", "inputSchema": {"type": "object"}, "_meta": {"hatp/journal": {"undo": {
            "kind": "none", "reason": "delivered", "remedy": "send a correction"}}}},
        {"name": "hatp_check", "inputSchema": {"type": "object"}},
        {"name": "hatp_compensate", "inputSchema": {"type": "object"}},
    ]


def journal_run(agent, server, steps: int, key: str):
    """`steps` calls journaled through the Recorder's own services, as if they had gone to the CRM."""
    from journal import services

    at = datetime.now(UTC) - timedelta(hours=1)
    for n in range(1, steps + 1):
        tool = "get_deal" if n % 10 == 0 else "send_email" if n % 10 == 5 else "update_deal"
        result = {"content": [{"type": "text", "text": "ok"}]}
        if tool == "update_deal":
            result["_meta"] = {
                "hatp/journal": {
                    "compensationToken": f"ctk_{n}",
                    "effect": {
                        "summary": f"Deal D-{n} stage: Proposal → Won",
                        "resource": f"crm://acme/deal/D-{n}",
                        "version": "v2",
                    },
                }
            }
        opened = services.open_step(agent=agent, run_key=key, server=server, server_name="crm", tool=tool,
                                    arguments={"deal_id": f"D-{n}"}, request_meta=None, now=at)
        services.close_step(opened=opened, outcome=services.Outcome(result=result), started=at,
                            finished=at + timedelta(milliseconds=5))
        at += timedelta(milliseconds=10)
    return agent.runs.get(key=key)


def counted(fn):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - started
    return value, elapsed, len(captured)


def page_queries(plan, user) -> int:
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(user)

    def get():
        response = client.get(reverse("approver:plan_detail", args=[plan.public_id]), HTTP_HOST="localhost")
        assert response.status_code == 200, response.status_code
        return response

    return counted(get)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--check-items", type=int, default=500)
    parser.add_argument("--delay-ms", type=int, default=20)
    parser.add_argument("--server-processes", type=int, default=3,
                        help="the sample CRM's processes for the second measure of the checks")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="plans-bench-"))
    setup_django(scratch)

    from django.conf import settings
    from django.contrib.auth.models import Group, User

    from approver import services
    from journal import services as journal_services
    from journal.auth import roles

    on_call = User.objects.create_user("olivia")
    on_call.groups.add(Group.objects.get(name=roles.ON_CALL))
    agent, _ = journal_services.create_agent(name="bench-bot", on_behalf_of=User.objects.create_user("dana"))
    server = journal_services.save_catalogue(
        server=journal_services.register_tool_server(name="crm", url="http://127.0.0.1:9/crm/mcp"),
        tools=crm_catalogue())

    started = time.perf_counter()
    big_run = journal_run(agent, server, args.steps, "run:big")
    print(f"(journaled a {args.steps:,}-step run in {time.perf_counter() - started:.1f} s)")
    from approver.services import bell

    bell.ring = lambda *args, **kwargs: None  # no broker here: the bench plays the worker itself
    plan, asked, asked_queries = counted(lambda: services.ask_for_plan(
        run=big_run, requested_by=on_call, reason="bench", from_step=1))
    plan, drafted, draft_queries = counted(lambda: services.draft_plan(plan=plan))
    print(f"1. plan from step 1 of a {args.steps:,}-step run: the web request {asked * 1000:.0f} ms "
          f"({asked_queries} queries); drafting in the worker {drafted:.2f} s ({draft_queries} queries, "
          f"{plan.items.count():,} items, state {plan.state})")

    small = services.request_plan(run=journal_run(agent, server, 10, "run:ten"), requested_by=on_call,
                                  reason="bench", from_step=1)
    thousand = services.request_plan(
        run=journal_run(agent, server, 1000, "run:thousand"),
        requested_by=on_call,
        reason="bench",
        from_step=1,
    )
    ten_q, thousand_q = page_queries(small, on_call), page_queries(thousand, on_call)
    print(f"2. queries to render the plan page: {small.items.count()} items {ten_q}, "
          f"{thousand.items.count():,} items {thousand_q} (target: equal)")

    for processes, (concurrent, sequential) in check_benchmark(args, on_call, agent, settings).items():
        print(f"3. checking {args.check_items} items against a server answering in {args.delay_ms} ms, "
              f"{processes} process{'es' if processes > 1 else ''}: concurrently (at most "
              f"{settings.PLAN_CHECKS_PER_SERVER} per server) {concurrent:.2f} s, one at a time "
              f"{sequential:.2f} s: {sequential / concurrent:.1f}x faster (target: at least 50x)")


def check_benchmark(args, on_call, agent, settings) -> dict[int, tuple[float, float]]:
    """Real HATP tokens from the sample CRM, checked through the real client with the server slowed down:
    (concurrently, one at a time) in seconds, against the CRM as one process and as several."""
    from approver import services
    from journal import services as journal_services
    from journal.models import ToolServer
    from samples.hatp import HatpServer  # noqa: F401 - the sample servers speak HATP through this

    port, state = 8193, Path(os.environ["VAR_DIR"]) / "samples"
    with sample_servers(port, state, processes=1, delay_ms=0):
        crm = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
            name="crm-live", url=f"http://127.0.0.1:{port}/crm/mcp"))
        assert crm.catalogue_error == "", crm.catalogue_error
        run = live_run(agent, crm, port, args.check_items)
        plan = services.request_plan(run=run, requested_by=on_call, reason="bench", from_step=1)
        assert plan.checks_total == args.check_items, plan.checks_total
    figures, queued = {}, True  # asking for the plan queued its first round of checks
    for processes in sorted({1, args.server_processes}):
        with sample_servers(port, state, processes=processes, delay_ms=args.delay_ms):
            results = {}
            for label, per_server in (("concurrent", settings.PLAN_CHECKS_PER_SERVER), ("sequential", 1)):
                assert queued or services.queue_checks(plan=plan, ring=False)
                queued = False
                plan.refresh_from_db()
                settings.PLAN_CHECKS_PER_SERVER, saved = per_server, settings.PLAN_CHECKS_PER_SERVER
                started = time.perf_counter()
                checked = services.run_checks(plan=plan, check_round=plan.check_round)
                results[label] = time.perf_counter() - started
                settings.PLAN_CHECKS_PER_SERVER = saved
                assert checked is not None and checked.checks_done == args.check_items
            statuses = dict(
                plan.items.values_list("check_status").annotate(n=__import__("django").db.models.Count("id"))
            )
            assert statuses.get("ok") == args.check_items, statuses  # each checked for real, none failed
            print(f"   (check results, {processes} process{'es' if processes > 1 else ''}: {statuses})")
            figures[processes] = (results["concurrent"], results["sequential"])
    ToolServer.objects.filter(pk=crm.pk).update(enabled=False)
    return figures


@contextlib.contextmanager
def sample_servers(port: int, state: Path, *, processes: int, delay_ms: int):
    """The sample servers on `port`, with their state and keys in `state`, as `processes` processes."""
    import httpx

    samples = subprocess.Popen([sys.executable, "-m", "samples", "--port", str(port), "--state", str(state),
                                "--workers", str(processes), "--delay-ms", str(delay_ms)],
                               cwd=ROOT, env={**os.environ})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/crm/ledger", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("the sample servers did not start") from None
                time.sleep(0.2)
        yield
    finally:
        samples.terminate()
        samples.wait(timeout=20)


def live_run(agent, crm, port: int, calls: int):
    """`calls` real deal updates on the sample CRM, journaled as the Recorder would, each with its token."""
    import anyio

    from journal import services
    from journal.upstream.client import Upstreams, endpoint_of

    endpoint = endpoint_of(crm)

    async def call_all():
        results = []
        async with Upstreams(timeout=30) as upstreams:
            for n in range(calls):
                stage = "Won" if n % 2 == 0 else "Negotiation"
                arguments = {"deal_id": "D-881", "stage": stage}
                results.append((arguments, await upstreams.call_tool(endpoint, "update_deal", arguments)))
        return results

    at = datetime.now(UTC) - timedelta(minutes=30)
    for arguments, result in anyio.run(call_all):
        opened = services.open_step(agent=agent, run_key="run:live", server=crm, server_name=crm.name,
                                    tool="update_deal", arguments=arguments, request_meta=None, now=at)
        services.close_step(opened=opened, outcome=services.Outcome(result=result), started=at,
                            finished=at + timedelta(milliseconds=5))
        at += timedelta(milliseconds=10)
    return agent.runs.get(key="run:live")


if __name__ == "__main__":
    main()
