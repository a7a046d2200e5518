"""`make demo`: everything a new user needs, started and stopped together.

Migrates the SQLite database in var/, creates one user per role, starts the sample tool servers, the web
app with the Recorder (uvicorn on localhost:8000), and a Celery worker with beat; registers the tool
servers, creates the sales-bot agent for Dana, and replays the Globex story through the Recorder with a
real MCP client. Ctrl-C stops every process it started. A second start reuses var/ and the keys.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.setdefault("VAR_DIR", str(ROOT / "var")))
WEB_PORT = int(os.environ.get("DEMO_PORT", "8000"))
SAMPLES_PORT = int(os.environ.get("DEMO_SAMPLES_PORT", "8100"))
SAMPLE_SERVERS = ("crm", "calendar", "mail", "payments", "inventory", "legacy", "desk")
# Two of the official servers, which declare nothing about undoing their tools: the demo puts their recipe
# packs in force (as ada), so the story's file write and knowledge-graph entities can be undone too.
OFFICIAL = ROOT / "tests" / "conformance" / "node_modules" / "@modelcontextprotocol"
FILES = VAR / "demo-files"
BRIEF = FILES / "globex-brief.md"
USERS = [  # username, role, what they do in the story
    ("olivia", "on-call", "on-call engineer"),
    ("ana", "approver", "team lead"),
    ("bo", "approver", "team lead"),
    ("ada", "admin", "admin"),
    ("dana", None, "account executive; sales-bot acts for her"),
]


def say(text: str = "") -> None:
    print(text, flush=True)


def wait_for(url: str, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what} did not start within {seconds:.0f} s ({url}); see the output above.")


def public_url(environ=os.environ, port: int = WEB_PORT) -> str:
    """The site's public URL for every process the demo starts: PUBLIC_URL when it is given, else the demo's
    own address on DEMO_PORT, so passkeys (whose origin must be the page's) and emailed links work on any
    port."""
    return environ.setdefault("PUBLIC_URL", f"http://localhost:{port}")


def setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def ensure_users() -> dict[str, str]:
    from django.contrib.auth.models import Group, User

    path = VAR / "demo-users.json"
    passwords = json.loads(path.read_text()) if path.exists() else {}
    for username, role, _ in USERS:
        password = passwords.setdefault(username, f"{username}-{secrets.token_hex(4)}")
        user, created = User.objects.get_or_create(username=username)
        if created or not user.check_password(password):
            user.set_password(password)
        if role == "admin":
            user.is_staff = user.is_superuser = True
        user.email = f"{username}@acme.example"  # the worker prints the emails they are sent
        user.save()
        if role:
            user.groups.add(Group.objects.get(name=role))
    path.write_text(json.dumps(passwords, indent=1))
    path.chmod(0o600)
    return passwords


def ensure_tool_servers() -> None:
    from journal import services
    from journal.models import ToolServer

    for name in SAMPLE_SERVERS:
        url = f"http://localhost:{SAMPLES_PORT}/{name}/mcp"
        server = ToolServer.objects.filter(name=name).first()
        if server is None:
            server = services.register_tool_server(name=name, url=url)
        elif server.url != url:
            server = services.save_tool_server(server=server, url=url)
        server = services.refresh_catalogue(server=server)
        status = server.catalogue_error or f"{len(server.catalogue)} tools"
        say(f"  tool server {name:<10} {url}  ({status})")


def ensure_official_servers() -> list[tuple[str, dict]]:
    """The official filesystem server (on var/demo-files) as `files` and the memory server as `notes`, with
    their recipe packs; returns the story's calls to them (none without Node and `make`'s npm install)."""
    import shutil

    from django.contrib.auth.models import User

    from approver import services as approver_services
    from journal import services
    from journal.models import ToolServer

    node = shutil.which("node")
    if node is None or not (OFFICIAL / "server-filesystem" / "dist" / "index.js").exists():
        say("  (no Node or no official servers installed: the files and notes servers are left out)")
        return []
    FILES.mkdir(parents=True, exist_ok=True)
    if not BRIEF.exists():
        BRIEF.write_bytes(b"# Globex\r\n\r\nStage: Qualified. Owner: Dana.\r\n")
    memory = VAR / "demo-memory.jsonl"
    if not memory.exists():  # Globex is known already: undoing the agent's entities must leave it
        memory.write_text(json.dumps({"type": "entity", "name": "Globex", "entityType": "company",
                                      "observations": ["prospect since March"]}) + "\n")
    commands = {
        "files": ("filesystem", f"{node} {OFFICIAL / 'server-filesystem/dist/index.js'} {FILES}"),
        "notes": ("memory",
                  f"env MEMORY_FILE_PATH={memory} {node} {OFFICIAL / 'server-memory/dist/index.js'}"),
    }
    ada = User.objects.get(username="ada")
    for name, (pack, command) in commands.items():
        server = ToolServer.objects.filter(name=name).first()
        if server is None or server.command != command:
            server = services.save_tool_server(server=server or ToolServer(name=name), command=command)
        server = services.refresh_catalogue(server=server)
        if server.recipe_pack != pack and not server.catalogue_error:
            approver_services.use_pack(server=server, pack=pack, by=ada)
        say(f"  tool server {name:<10} the official {pack} server, the {pack} recipe pack in force "
            f"({server.catalogue_error or f'{len(server.catalogue)} tools'})")
    return [
        ("files__write_file", {"path": str(BRIEF), "content": "# Globex\n\nStage: Won. Kickoff Dec 4.\n"}),
        ("notes__create_entities", {"entities": [
            {"name": "Globex", "entityType": "company", "observations": ["won"]},
            {"name": "Globex kickoff", "entityType": "meeting", "observations": ["2026-12-04 15:00 UTC"]}]}),
    ]


def ensure_agent(name: str = "sales-bot", file: str = "demo-agent-token") -> str:
    from django.contrib.auth.models import User

    from journal import services
    from journal.models import Agent

    path = VAR / file
    agent = Agent.objects.filter(name=name).first()
    if agent is None:
        agent, token = services.create_agent(name=name, on_behalf_of=User.objects.get(username="dana"))
    elif path.exists() and services.authenticate_agent(path.read_text().strip()) == agent:
        return path.read_text().strip()
    else:
        token = services.reset_agent_token(agent=agent)
    path.write_text(token)
    path.chmod(0o600)
    return token


def ensure_policy() -> None:
    """The demo's autonomy policies, set once each (as ada, in the change log): act freely where the API can
    take it back, ask an approver first for everything else; on the customer desk, whose own screens take a
    change back (trash and restore, edit back), the agent acts freely too, and an undo there is still
    signed."""
    from django.contrib.auth.models import User

    from approver import policy, services
    from approver.models import AutonomyPolicy
    from journal.models import ToolServer

    ada = User.objects.get(username="ada")
    if not AutonomyPolicy.objects.filter(scope="everything").exists():
        services.save_policy(row=AutonomyPolicy(name="Default", scope="everything", ask_timeout=600,
                                                decisions=dict(policy.DEFAULT_DECISIONS)), by=ada)
        say("  autonomy policy “Default”: compensate via api allow; everything else ask an approver")
    desk = ToolServer.objects.filter(name="desk").first()
    if desk is not None and not AutonomyPolicy.objects.filter(scope="server", server=desk).exists():
        services.save_policy(row=AutonomyPolicy(
            name="Desk: its screens take changes back", scope="server", server=desk, ask_timeout=600,
            decisions={**policy.DEFAULT_DECISIONS, "compensate_ui": "allow"}), by=ada)
        say("  autonomy policy “Desk: its screens take changes back”: compensate via ui allow on desk")


def replay_globex(token: str, official: list[tuple[str, dict]]) -> None:
    """sales-bot tells the Globex story in the background (with its calls to the official servers before the
    email): its email cannot be undone, so the policy holds it, and the agent keeps asking until an approver
    signs (or denies) it in the browser."""
    import threading

    import anyio

    from approver.models import ActionRequest
    from journal.models import Run
    from samples import agent as scripted

    run = Run.objects.filter(key=f"run:{scripted.RUN_ID}").first()
    email = next(n for n, (name, _) in enumerate(scripted.DEMO_STORY) if name == "mail__send_email")
    story = [*scripted.DEMO_STORY[:email], *official, *scripted.DEMO_STORY[email:]]
    if run is not None:
        made = set(run.steps.filter(status="ok").values_list("server_name", "tool"))
        story = [(name, arguments) for name, arguments in story if tuple(name.split("__", 1)) not in made]
        if not story:
            say("  the Globex run is already recorded (kept from the last start)")
            return
        say(
            f"  sales-bot goes on with the Globex story where the last start left it ({len(story)} call(s) "
            f"left):"
        )
    else:
        say("  sales-bot replays the Globex story through the Recorder:")
    threading.Thread(target=lambda: anyio.run(lambda: scripted.replay(
        f"http://localhost:{WEB_PORT}/mcp/", token, say=say, patient=True, story=story)), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = ActionRequest.objects.filter(state=ActionRequest.State.PENDING, tool="send_email").first()
        if held is not None:
            say(f"  sales-bot's email to Globex waits for an approver: http://localhost:{WEB_PORT}"
                f"/actions/{held.public_id}/")
            return
        if Run.objects.filter(
            key=f"run:{scripted.RUN_ID}", steps__tool="send_email", steps__status="ok"
        ).exists():
            return  # no policy held it (or an approval from the last start let it through)
        time.sleep(0.5)


def replay_cleanup() -> None:
    """cleanup-bot "cleans up" the customer database in the background: 1,196 contacts deleted, 4 fake ones
    inserted (both undoable row by row), then a table dropped, which waits for an approver."""
    import threading

    import anyio

    from approver import demo_database
    from approver.models import ActionRequest
    from journal.models import Run
    from samples import agent as scripted

    server = demo_database.ensure_customers(VAR, say=say)
    if server is None:
        return
    if Run.objects.filter(key=f"run:{demo_database.RUN_ID}").exists():
        say("  the customer cleanup run is already recorded (kept from the last start)")
        return
    token = ensure_agent("cleanup-bot", "demo-cleanup-token")
    story = demo_database.story(demo_database.where(VAR)[3])
    say("  cleanup-bot cleans up the customer database through the Recorder:")
    threading.Thread(target=lambda: anyio.run(lambda: scripted.replay(
        f"http://localhost:{WEB_PORT}/mcp/", token, run_id=demo_database.RUN_ID, say=say, patient=True,
        story=story)), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = ActionRequest.objects.filter(state=ActionRequest.State.PENDING, server=server).first()
        if held is not None:
            say(f"  cleanup-bot's DROP TABLE companies waits for an approver: http://localhost:{WEB_PORT}"
                f"/actions/{held.public_id}/")
            return
        time.sleep(0.5)


def wait_for_worker(seconds: float = 60) -> bool:
    from approver.celery import app

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if app.control.ping(timeout=1.0):
            return True
    return False


def main() -> None:
    VAR.mkdir(parents=True, exist_ok=True)
    # The whole service starts again: every process's metrics start from nothing (docs/production.md).
    metrics = Path(os.environ.get("METRICS_DIR") or VAR / "metrics")
    for counted in metrics.glob("*.db"):
        counted.unlink()
    site = public_url()  # before Django reads its settings, and inherited by every process started here
    (VAR / "public-url").write_text(site)  # for commands run in another terminal (`content.site_url`)
    setup_django()
    passwords = ensure_users()
    python = sys.executable
    children: list[subprocess.Popen] = []

    def start(argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        say(f"  starting {name}")
        children.append(subprocess.Popen(argv, cwd=ROOT, start_new_session=True,
                                         env={**os.environ, **(env or {})}))

    def stop(*_args) -> None:
        say("\nStopping the demo…")
        for child in children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        say("Stopped everything the demo started.")
        raise SystemExit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    say("Starting the demo")
    start(
        [
            python,
            "-m",
            "samples",
            "--host",
            "localhost",
            "--port",
            str(SAMPLES_PORT),
            "--state",
            str(VAR / "samples"),
        ],
        "sample tool servers",
    )
    start(
        [
            python,
            "-m",
            "uvicorn",
            "approver.asgi:application",
            "--host",
            "localhost",
            "--port",
            str(WEB_PORT),
            "--log-level",
            "warning",
        ],
        "web app and Recorder",
    )
    # --quiet: no banner; the worker still says what goes wrong, and prints the emails it sends as they are
    # (not as log lines). Celery's warning about running as root (a container's user) is not news here.
    start([python, "-m", "celery", "-A", "approver", "--quiet", "worker", "--beat", "--pool=solo",
           "--loglevel=WARNING", f"--schedule={VAR / 'celerybeat-schedule'}", "--hostname=demo@%h"],
          "Celery worker (with beat)",
          env={"CELERY_WORKER_REDIRECT_STDOUTS": "false",
               "PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges"})
    try:
        wait_for(f"http://localhost:{SAMPLES_PORT}/crm/ledger", "The sample tool servers")
        wait_for(f"http://localhost:{WEB_PORT}/login/", "The web app")
        ensure_tool_servers()
        official = ensure_official_servers()
        ensure_policy()
        token = ensure_agent()
        replay_globex(token, official)
        replay_cleanup()
        worker = "running" if wait_for_worker() else "NOT answering (see its output above)"
    except BaseException:
        stop()
        raise
    say()
    say(
        f"Ready: http://localhost:{WEB_PORT}/   (health: http://localhost:{WEB_PORT}/health/; worker "
        f"{worker})"
    )
    say(f"Passkeys and emailed links use {site} (set PUBLIC_URL to change it).")
    say("Log in as:")
    for username, role, what in USERS:
        say(f"  {username:<7} {passwords[username]:<16} {role or 'no role':<9} {what}")
    say(f"Agents connect to http://localhost:{WEB_PORT}/mcp/ with the token in {VAR / 'demo-agent-token'};")
    say(f"  a client that takes only a URL is given http://localhost:{WEB_PORT}/mcp and signs in as dana.")
    say(f"A colleague's edit: curl -X POST localhost:{SAMPLES_PORT}/crm/colleague/update_deal "
        "-d '{\"deal_id\": \"D-881\", \"changes\": {\"amount\": 45000}, \"by\": \"priya\"}'")
    say("Ctrl-C stops everything.")
    while True:
        for child in children:
            if child.poll() is not None:
                say(f"A demo process exited with code {child.returncode}: {' '.join(child.args[:4])}")
                stop()
        time.sleep(1)


if __name__ == "__main__":
    main()
