"""How long a failed call waits while a saga policy unwinds its run, in the running demo.

    make demo                     # in another terminal
    .venv/bin/python bench/unwind.py [--steps 2]

Against the demo's database, Recorder and sample CRM: sets a tool-server policy on `crm` ("when a call fails:
unwind", safe plans run alone), has an agent change `--steps` deals through the Recorder in one run, then make
a call that fails, and prints how long that failing call took (the unwind happens before the agent hears of
its failure), next to how long the same failing call takes without the policy, and what was unwound. The
deals are put back by the unwind itself; the policy is removed at the end.
"""

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--url", default="http://localhost:8000/mcp/")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")
    import django

    django.setup()
    import anyio
    from django.contrib.auth.models import User

    from approver import policy, services
    from approver.models import AutonomyPolicy
    from journal import services as journal_services
    from journal.models import ToolServer
    from samples.agent import connect

    crm = ToolServer.objects.filter(name="crm").first()
    if crm is None:
        raise SystemExit("No crm tool server: start the demo first (make demo).")
    dana, ada = User.objects.get(username="dana"), User.objects.get(username="ada")
    _, token = journal_services.create_agent(name=f"bench-{uuid.uuid4().hex[:6]}", on_behalf_of=dana)
    deals = ["D-881", "D-882"]

    async def story(run_id: str) -> tuple[float, dict]:
        async with connect(args.url, token) as client:
            meta = {"hatp/journal": {"runId": run_id}}
            for n in range(args.steps):
                deal = deals[n % len(deals)]
                changed = await client.call_tool(
                    "crm__update_deal", {"deal_id": deal, "amount": str(time.time_ns() % 10**9)}, meta=meta)
                if changed.is_error:
                    raise SystemExit(f"the change itself failed: {changed.content[0].text}")
            started = time.perf_counter()
            failed = await client.call_tool(
                "crm__update_deal", {"deal_id": "D-404", "stage": "Won"}, meta=meta
            )
            elapsed = time.perf_counter() - started
        return elapsed, (failed.meta or {}).get("hatp/journal", {})

    plain, _ = anyio.run(story, f"bench-plain-{uuid.uuid4().hex[:6]}")
    row = services.save_policy(row=AutonomyPolicy(
        name=f"Bench unwind {uuid.uuid4().hex[:4]}", scope="server", server=crm, auto_run_plans=True,
        on_failure="unwind", decisions=dict.fromkeys(policy.CLASSES, "allow")), by=ada)
    try:
        unwound_in, journal = anyio.run(story, f"bench-unwind-{uuid.uuid4().hex[:6]}")
    finally:
        services.delete_policy(row=row, by=ada)
    unwound = journal.get("unwound") or {}
    if not unwound.get("reversed"):
        print("the error said:", {k: v for k, v in journal.items() if k != "recovery"})
    print(f"a failing call with no saga policy: {plain * 1000:.0f} ms")
    print(f"a failing call after {args.steps} changes, unwound before the answer: {unwound_in * 1000:.0f} ms "
          f"(plan {unwound.get('state')}: {unwound.get('summary')})")
    for item in unwound.get("reversed", []):
        print(f"  reversed step {item['step']}: {item['summary']}")
    for item in unwound.get("notReversed", []):
        print(f"  not reversed step {item['step']}: {item['outcome']}: {item['why']}")


if __name__ == "__main__":
    main()
