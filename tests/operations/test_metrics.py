"""`/metrics` as Prometheus scrapes it, while agents call through two Recorder processes (uvicorn
`--workers 2`) and a real worker checks and runs a plan: every process counts into one directory, and the
scrape reads the right figures: each call once, by server, tool, outcome and decision (a tool error counted
as one, a held call as held, a denied one as refused), the held call waiting, the plan's checks and
compensations, and the database's states. Who may scrape, and what a hostile agent can do to the labels."""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from prometheus_client import multiprocess
from prometheus_client.parser import text_string_to_metric_families

from approver import observed, services
from approver.models import Plan
from journal import services as journal_services
from journal.models import Run, Step
from journal.telemetry import metrics
from samples import agent as scripted
from tests.approver.services.test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture
from tests.approver.services.test_held_calls import set_policy
from tests.conftest import free_port
from tests.journal.helpers import hang_up_after_sending, register_samples, run_agent
from tests.services import REDIS_URL, needs_redis, running_worker, worker_env_for_test_database

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent.parent


@contextlib.contextmanager
def recorders(env: dict, workers: int = 2, log=subprocess.DEVNULL):
    """The web app (Recorder included) as `workers` uvicorn processes on the test's database, writing its log
    to `log`."""
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", "approver.asgi:application", "--workers",
                            str(workers), "--port", str(port), "--log-level", "warning"], env=env,
                           stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(f"http://127.0.0.1:{port}/login/", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the Recorder's processes did not start")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        web.terminate()
        web.wait(timeout=30)


def scrape(base: str, **headers) -> dict:
    """Every sample of the scrape: {(name, labels as a sorted tuple): value}."""
    answer = httpx2.get(f"{base}/metrics", headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")  # the exposition format
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text) for sample in family.samples}


def calls(samples: dict, **labels) -> float:
    """undo_tool_calls_total summed over every series whose labels include `labels`."""
    return sum(value for (name, found), value in samples.items()
               if name == "undo_tool_calls_total" and set(labels.items()) <= set(found))


async def call(base: str, token: str, name: str, arguments: dict):
    async with scripted.connect(f"{base}/mcp/", token) as client:
        return await client.call_tool(name, arguments, meta={"hatp/journal": {"runId": "globex-kickoff"}})


def wait_for(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout} s")
        time.sleep(0.2)
    return found


@pytest.mark.postgres
@needs_redis
def test_a_scrape_reads_each_call_held_call_check_and_compensation_across_processes(
        sample_servers, dana, admin_user, on_call, approver_user, second_approver, tmp_path):
    register_samples(sample_servers)
    set_policy(admin_user, ask_timeout=600)  # the email (it cannot be undone) asks a person first
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    env = {**worker_env_for_test_database(), "METRICS_DIR": str(tmp_path / "metrics"),
           "RECORDER_HOLD_WAIT_SECONDS": "1", "RECORDER_BUS_URL": REDIS_URL}
    env.pop("REDIS_URL", None)
    # Two Recorder processes (behind a balancer, as in production: here the agent picks one per call) and a
    # worker, every one of them counting into the one directory.
    with recorders(env, workers=1) as first, recorders(env, workers=1) as base, \
            running_worker(env, "metrics"):
        # The Globex story through the first: a read, two changes that can be undone, and the email, held
        # (its agent is told it awaits approval); then, through the second, a deal that is not there (the
        # server's tool error) and a made-up tool.
        anyio.run(lambda: scripted.replay(f"{first}/mcp/", token, say=lambda _: None))
        missing = anyio.run(call, base, token, "crm__get_deal", {"deal_id": "D-404"})
        made_up = anyio.run(call, base, token, "crm__no_such_tool_8f3a", {})
        assert missing.is_error and made_up.is_error
        run = Run.objects.get(agent__name="sales-bot")
        plan = services.request_plan(run=run, requested_by=on_call, reason="wrong customer", from_step=1)
        plan = wait_for(lambda: Plan.objects.filter(pk=plan.pk, state="ready").first(), "the worker's checks")
        for user in (approver_user, second_approver):
            approve(plan, user, enrolled(user), choices={})
        wait_for(lambda: Plan.objects.filter(pk=plan.pk, state__in=("completed", "partially_completed"))
                 .exists(), "the worker's execution")
        samples = wait_for(lambda: (found := scrape(base))
                           and found.get(("undo_compensations_total", (("outcome", "compensated"),))) == 2
                           and found, "the compensations' count")

    assert calls(samples, server="crm", tool="get_deal", outcome="ok", decision="allow") == 1
    assert calls(samples, server="crm", tool="get_deal", outcome="tool_error") == 1  # counted as one
    assert calls(samples, server="crm", tool="update_deal", outcome="ok", decision="allow") == 1
    assert calls(samples, server="calendar", tool="create_event", outcome="ok") == 1
    assert calls(samples, server="mail", tool="send_email", outcome="held", decision="ask") == 1
    assert calls(samples, server="crm", tool="(unlisted)") == 1  # a made-up name is no label of its own
    assert calls(samples) == 6
    assert samples[("undo_held_calls_waiting", ())] == 1
    assert samples[("undo_held_call_oldest_wait_seconds", ())] > 0
    assert samples[("undo_checks_total", (("result", "ok"),))] == 2
    assert samples[("undo_plans", (("state", "completed"),))] == 1  # the email is on its to-do list
    assert samples[("undo_plans", (("state", "ready"),))] == 0
    assert samples[("undo_unknown_outcomes_waiting", ())] == 0
    assert samples[("undo_journal_commit_seconds_count", ())] > 0
    assert ("undo_worker_queue_depth", (("queue", "celery"),)) in samples
    assert samples[("undo_tool_call_duration_seconds_count", (("server", "crm"),))] == 4
    # The second Recorder's scrape read the first's calls, and the worker's checks and compensations.
    per_process = {path.name: sum(s.value for m in multiprocess.MultiProcessCollector.merge([str(path)])
                                  for s in m.samples if s.name == "undo_tool_calls_total")
                   for path in (tmp_path / "metrics").glob("counter_*.db")}
    assert sorted(n for n in per_process.values() if n) == [2, 4]


def counted(server: str, tool: str, outcome: str, decision: str) -> float:
    return metrics.TOOL_CALLS.labels(server, tool, outcome, decision)._value.get()


def test_a_denied_call_a_timeout_and_a_refused_name_are_each_counted_as_what_the_agent_heard(
        recorder, sample_servers, dana, admin_user):
    register_samples(sample_servers, names=("crm", "mail"))
    _, token = journal_services.create_agent(name="bot", on_behalf_of=dana)
    set_policy(admin_user, none="deny")
    recorder.app.recorder.upstreams.timeout = 1.0
    before = {key: counted(*key) for key in (("mail", "send_email", "refused", "deny"),
                                             ("crm", "update_deal", "timeout", "allow"),
                                             ("", "", "refused", "none"))}

    async def script(client):
        denied = await client.call_tool("mail__send_email",
                                        {"to": "a@b.example", "subject": "s", "body": "b"})
        nowhere = await client.call_tool("nowhere__tool", {})
        sample_servers.set_mode("crm", "hang")
        late = await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})
        return denied, nowhere, late

    results = run_agent(recorder, token, script)
    assert all(result.is_error for result in results)
    assert {key: counted(*key) - value for key, value in before.items()} == {
        ("mail", "send_email", "refused", "deny"): 1, ("crm", "update_deal", "timeout", "allow"): 1,
        ("", "", "refused", "none"): 1}


def test_metrics_are_open_to_the_allowed_addresses_or_the_token_and_off_when_switched_off(client, settings):
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1
    away = client.get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert away.status_code == 401 and away["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert "METRICS_ALLOW" in away.content.decode()
    settings.METRICS_TOKEN = "scrape-token-1"
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9",
                      headers={"Authorization": "Bearer scrape-token-1"}).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9",
                      headers={"Authorization": "Bearer scrape-token-2"}).status_code == 401
    assert client.post("/metrics").status_code == 405
    settings.METRICS = False
    assert client.get("/metrics").status_code == 404


def test_a_scrape_drops_the_live_gauges_of_a_process_that_no_longer_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "DIRECTORY", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = tmp_path / f"gauge_livesum_{int(gone.stdout)}.db"
    alive = tmp_path / f"gauge_livesum_{os.getpid()}.db"
    counter = tmp_path / f"counter_{int(gone.stdout)}.db"
    for path in (dead, alive, counter):
        path.write_bytes(b"")
    metrics.forget_dead()
    assert not dead.exists() and alive.exists() and counter.exists()  # a counter must never go down


def test_the_dashboard_and_the_page_name_only_metrics_the_product_exports(settings):
    settings.AUDIT_STREAM = ["syslog+tcp://siem.example:514"]
    exported = set()
    for family in (metrics.TOOL_CALLS, metrics.TOOL_CALL_SECONDS, metrics.JOURNAL_COMMIT_SECONDS,
                   metrics.JOURNAL_GROUP_SIZE, metrics.JOURNAL_QUEUE, metrics.CHECKS, metrics.COMPENSATIONS,
                   metrics.AUDIT_DELIVERED, metrics.AUDIT_FAILURES, metrics.ANSWERS_LOST,
                   metrics.ROWS_MISREAD, metrics.ROWS_UNRECORDED):
        exported |= {sample.name for metric in family.describe() for sample in metric.samples} | {
            f"{family._name}{suffix}" for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    exported |= {metric.name for metric in observed.States().collect()}
    dashboard = (ROOT / "docs" / "grafana" / "agent-undo.json").read_text()
    page = (ROOT / "docs" / "production.md").read_text()
    used = set(re.findall(r"\bundo_[a-z_]+", dashboard)) | set(re.findall(r"`(undo_[a-z_]+)`", page))
    assert used - exported == set() and {"undo_unknown_outcomes_waiting", "undo_tool_calls_total"} <= used
    assert json.loads(dashboard)["panels"][0]["title"] == "Unknown outcomes waiting to be settled"


@pytest.mark.parametrize("delay_ms", [20, 1500])
def test_an_agent_that_hangs_up_is_counted_once_as_the_record_says(recorder, sample_servers, dana, delay_ms):
    """Gone before the server answered, the call was left: the record and the count say cancelled. Gone
    after (a race with a quick server), the record says its answer was not delivered: counted by its
    outcome, and as an answer lost."""
    register_samples(sample_servers, names=("legacy",))
    _, token = journal_services.create_agent(name="bot", on_behalf_of=dana)
    run_agent(recorder, token, lambda client: client.call_tool("legacy__echo", {}))  # its session is open
    sample_servers.set_mode("legacy", "normal", delay_ms=delay_ms)
    every = [("legacy", "create_ticket", outcome, "allow") for outcome in metrics.OUTCOMES]
    before = {key: counted(*key) for key in every}
    lost_before = metrics.ANSWERS_LOST.labels("legacy")._value.get()
    hang_up_after_sending(recorder.port, token, "legacy__create_ticket", {"title": "left"})

    def changed():
        return {key[2]: counted(*key) - value for key, value in before.items() if counted(*key) != value}

    wait_for(lambda: sum(changed().values()) == 1, "the call's count")
    step = wait_for(lambda: Step.objects.filter(tool="create_ticket").exclude(status="pending").first(),
                    "the step's outcome")
    settled = ("cancelled", "undelivered")
    lost = wait_for(lambda: Step.objects.get(pk=step.pk).status in settled
                    and [metrics.ANSWERS_LOST.labels("legacy")._value.get() - lost_before], "the record")[0]
    step.refresh_from_db()
    expected = {"cancelled": ({"cancelled": 1}, 0), "undelivered": ({"ok": 1}, 1)}[step.status]
    assert (changed(), lost) == expected
    assert step.status == "cancelled" or delay_ms < 1000  # a slow server's call is always left
