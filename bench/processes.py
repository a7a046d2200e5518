"""The Recorder as several worker processes behind one port, on PostgreSQL and a Redis bus.

    .venv/bin/python bench/processes.py [--workers 3] [--agents 20] [--calls 200] [--kill]
        [--database-url postgres://undo_ci:undo_ci@localhost:5432/undo_bench] [--redis-url redis://localhost:6379/13]
        [--direct]

Creates the database afresh (and drops it at the end), starts the sample tool servers and `uvicorn
approver.asgi:application --workers N`,
then runs the agents at once (half on the initialize handshake, half on the stateless 2026-07-28 protocol),
each making its calls to the sample `legacy__create_ticket` on a new connection every request (so any worker
gets any request of any session), while one more call, which the autonomy policy holds, is approved with a
passkey as its request waits. With --kill, one worker is killed (SIGKILL) a third of the way through and
uvicorn starts another. Prints the errors the agents saw, how many calls were journaled (once each?), whether
every run's chain verifies with a gapless seq, whether the held call went through once, and throughput.
With --direct, the same agents call the sample server itself, for the throughput to compare with.
"""

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recorder_latency import wait  # noqa: E402 - bench/ is not a package

EMAIL = {"to": "buyer@globex.example", "subject": "Welcome aboard", "body": "Hello"}


def database(url: str, *, create: bool) -> None:
    """Create the bench's database afresh, or drop it."""
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            admin.execute(f'CREATE DATABASE "{name}"')


def workers_of(pid: int) -> list[int]:
    """uvicorn's worker processes under its master `pid` (not multiprocessing's resource tracker)."""
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found
            if "spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--kill", action="store_true")
    parser.add_argument(
        "--direct", action="store_true", help="the agents call the tool server itself (no Recorder)"
    )
    parser.add_argument("--database-url", default="postgres://undo_ci:undo_ci@localhost:5432/undo_bench")
    parser.add_argument("--redis-url", default="redis://localhost:6379/13")
    args = parser.parse_args()
    database(args.database_url, create=True)
    scratch = Path(tempfile.mkdtemp(prefix="processes-bench-"))
    env = {
        **os.environ,
        "VAR_DIR": str(scratch),
        "RECORDER_KEY_DIR": str(scratch / "keys"),
        "DEBUG": "0",
        "DJANGO_SETTINGS_MODULE": "approver.settings",
        "LOG_LEVEL": "WARNING",
        "DATABASE_URL": args.database_url,
        "RECORDER_BUS_URL": args.redis_url,
        "ALLOWED_HOSTS": "localhost,127.0.0.1",
    }
    env.pop("REDIS_URL", None)
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    samples = subprocess.Popen([sys.executable, "-m", "samples", "--port", "8198"], cwd=ROOT, env=env)
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", "approver.asgi:application", "--port", "8199",
                            "--workers", str(args.workers), "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        wait("http://127.0.0.1:8198/legacy/ledger")
        wait("http://127.0.0.1:8199/login/")
        run_agents(args)
    finally:
        for process in (samples, web):
            process.terminate()
            process.wait(timeout=30)
        from django.db import connections

        connections.close_all()
        database(args.database_url, create=False)


def run_agents(args) -> None:
    import anyio
    import httpx2
    from django.contrib.auth.models import Group, User
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from webauthn.helpers import base64url_to_bytes

    from approver import policy
    from approver import services as approver_services
    from approver.models import ActionRequest, AutonomyPolicy
    from journal import services
    from journal.auth import roles
    from journal.models import Run, Step
    from tests.approver.softkey import SoftKey

    for name in ("legacy", "mail"):
        services.refresh_catalogue(server=services.register_tool_server(
            name=name, url=f"http://127.0.0.1:8198/{name}/mcp"))
    admin = User.objects.create_user("admin")
    admin.groups.add(Group.objects.get_or_create(name=roles.ADMIN)[0])
    approver = User.objects.create_user("ana")
    approver.groups.add(Group.objects.get_or_create(name=roles.APPROVER)[0])
    approver_services.save_policy(
        row=AutonomyPolicy(
            name="bench",
            scope="everything",
            ask_timeout=600,
            quorum=1,
            decisions={**policy.DEFAULT_DECISIONS, "unknown": "allow"},
        ),
        by=admin,
    )
    owner = User.objects.create_user("dana")
    agents = [(f"bot-{n}", services.create_agent(name=f"bot-{n}", on_behalf_of=owner)[1],
               "legacy" if n % 2 else "auto") for n in range(args.agents)]
    _, mailer = services.create_agent(name="mailer", on_behalf_of=owner)
    url = "http://127.0.0.1:8198/legacy/mcp" if args.direct else "http://127.0.0.1:8199/mcp/"
    tool = "create_ticket" if args.direct else "legacy__create_ticket"
    errors: dict[str, list[str]] = {}
    done = [0]

    async def agent(name: str, token: str, mode: str) -> None:
        """Its calls, one after another; a session whose connection broke is opened again, as an agent
        would."""
        n = 0
        while n < args.calls:
            try:
                async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120,
                                              limits=httpx2.Limits(max_keepalive_connections=0)) as http:
                    async with Client(
                        streamable_http_client(url, http_client=http), mode=mode, cache=None
                    ) as client:
                        while n < args.calls:
                            n += 1
                            done[0] += 1
                            try:
                                result = await client.call_tool(tool, {"title": f"{name}-{n}"})
                                if result.is_error:
                                    errors.setdefault(name, []).append(result.content[0].text[:100])
                            except Exception as exc:  # noqa: BLE001 - counted: what an agent saw
                                errors.setdefault(name, []).append(f"{type(exc).__name__}: {str(exc)[:100]}")
            except Exception as exc:  # noqa: BLE001 - the session broke under it: counted, and opened again
                errors.setdefault(name, []).append(f"session broke: {type(exc).__name__}")

    mailed = {}

    async def mail() -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {mailer}"}, timeout=700,
                                      limits=httpx2.Limits(max_keepalive_connections=0)) as http:
            async with Client(
                streamable_http_client(url, http_client=http), mode="legacy", cache=None
            ) as client:
                mailed["result"] = await client.call_tool("mail__send_email", EMAIL)

    def approve_when_held() -> None:
        while not (action := ActionRequest.objects.filter(state="pending").first()):
            time.sleep(0.2)
        time.sleep(1.0)
        key = SoftKey()
        approver_services.enroll_passkey(user=approver, name="key", credential=key.register(b"e" * 32),
                                         challenge=b"e" * 32)
        request, _ = approver_services.begin_action_signing(action=action, user=approver, decision="approve")
        approver_services.complete_action_signing(user=approver, nonce=request.nonce,
                                                  credential=key.sign(base64url_to_bytes(request.challenge)))

    killed = []

    def kill_one_worker(master: int) -> None:
        while done[0] < args.agents * args.calls // 3:
            time.sleep(0.05)
        victim = random.choice(workers_of(master))
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)

    approver_thread = threading.Thread(target=approve_when_held, daemon=True)
    if not args.direct:
        approver_thread.start()
    if args.kill:
        master = int(subprocess.run(["pgrep", "-f", "uvicorn approver.asgi:application --port 8199"],
                                    capture_output=True, text=True).stdout.split()[0])
        threading.Thread(target=kill_one_worker, args=(master,), daemon=True).start()

    async def everyone() -> None:
        async with anyio.create_task_group() as group:
            if not args.direct:
                group.start_soon(mail)
            for name, token, mode in agents:
                group.start_soon(agent, name, token, mode)

    started = time.perf_counter()
    anyio.run(everyone)
    seconds = time.perf_counter() - started
    if args.direct:
        print(
            f"directly: {args.agents} agents x {args.calls} calls, {sum(map(len, errors.values()))} errors; "
            f"throughput: {args.agents * args.calls / seconds:.0f} calls/s ({seconds:.1f} s)"
        )
        return
    approver_thread.join(timeout=60)
    time.sleep(2)  # the journal's last writes
    import httpx

    ledger = httpx.get("http://127.0.0.1:8198/legacy/ledger").json()["ledger"]
    tickets = [entry for entry in ledger if entry["op"] == "create_ticket"]
    steps = Step.objects.filter(tool="create_ticket")
    by_status = {
        status: steps.filter(status=status).count() for status in set(steps.values_list("status", flat=True))
    }
    runs = list(Run.objects.all())
    gapless = all(
        list(run.entries.order_by("seq").values_list("seq", flat=True)) == list(range(1, run.head_seq + 1))
        for run in runs
    )
    intact = sum(services.verify_run(run=run).ok for run in runs)
    mail_sent = [entry for entry in httpx.get("http://127.0.0.1:8198/mail/ledger").json()["ledger"]
                 if entry["op"] == "send_email"]
    total = args.agents * args.calls
    seen = sum(len(found) for found in errors.values())
    print(
        f"{args.workers} Recorder workers on PostgreSQL and Redis; {args.agents} agents "
        f"({args.agents // 2} on the handshake, {args.agents - args.agents // 2} stateless) x {args.calls} "
        f"calls"
        + (f"; worker {killed[0]} killed (SIGKILL) a third of the way in" if killed else "")
    )
    print(
        f"  errors the agents saw: {seen} of {total} calls"
        + (
            f" (agents: {', '.join(sorted(errors))}; first: {next(iter(errors.values()))[0]})"
            if errors
            else ""
        )
    )
    print(f"  journaled: {steps.count()} steps for {total} calls, by status {by_status}; the server acted "
          f"{len(tickets)} times")
    print(f"  runs: {len(runs)}, chains gapless: {gapless}, verified: {intact} of {len(runs)}")
    went_through = mailed.get("result") and not mailed["result"].is_error
    print(f"  held call: {'went through' if went_through else 'FAILED'}, emails sent: {len(mail_sent)}")
    print(f"  throughput: {total / seconds:.0f} calls/s ({seconds:.1f} s)")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
