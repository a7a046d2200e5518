"""Issue 43, done when: the Recorder's process killed (SIGKILL) at every point of a held call's life, through
real Recorder processes (uvicorn, which starts a new one), judged by the mail server's ledger:

- held: the call waits in the agent's request for an approver; killed, then approved;
- approved: killed at once after the approval, while the waiting request may be claiming it;
- sending: approved and released, the server holding the call before it acts;
- answered: the server acted and holds its answer back.

Afterwards the reconciler runs (as the worker's beat would), and the agent makes each call once more. Nothing
is sent that the record says was never sent, nothing is sent twice, and every email the server sent is on
the record as sent (or as possibly sent)."""

import collections
import os
import signal
import threading
import time
from datetime import timedelta

import anyio
import httpx2
import pytest
from django.db import connection
from django.utils import timezone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from approver import services as approver_services
from approver.models import ActionRequest, AutonomyPolicy
from journal import ports, services
from journal.models import Step
from tests.approver.services.test_held_calls import decide, set_policy
from tests.journal.helpers import register_samples
from tests.journal.test_worker_processes import recorder_processes, workers_of
from tests.services import needs_redis

pytestmark = [pytest.mark.faults, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
POINTS = ("held", "approved", "sending", "answered")
# What the record says of an attempt: sent (or possibly), or never sent.
SENT = ("ok", "error", "pending", "cancelled", "undelivered")


def email(point: str) -> dict:
    return {"to": "buyer@globex.example", "subject": f"killed while {point}", "body": "Hello"}


def agent_call(url: str, token: str, arguments: dict, box: dict) -> threading.Thread:
    """The agent's call, in a thread of its own: what it heard (or how it broke) lands in `box`."""

    async def main():
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
                return await client.call_tool("mail__send_email", arguments)

    def run():
        try:
            box["result"] = anyio.run(main)
        except Exception as exc:  # noqa: BLE001 - a killed Recorder breaks the agent's connection
            box["error"] = type(exc).__name__

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(predicate, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.05)
    return found


def kill_the_recorder(master: int, url: str) -> None:
    """Every Recorder process killed; uvicorn starts new ones."""
    killed = set(workers_of(master))
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(set(workers_of(master)) - killed) == 2, "uvicorn starting new Recorder processes")
    wait_for(lambda: _serving(url), "the new Recorder processes serving")


def _serving(url: str) -> bool:
    try:
        return httpx2.get(url.replace("/mcp/", "/login/"), timeout=2).status_code == 200
    except httpx2.HTTPError:
        return False


def subject_steps(point: str):
    return Step.objects.filter(tool="send_email", arguments__subject=f"killed while {point}")


def kill_while(point: str, url: str, token: str, master: int, sample_servers, approver_user, figures) -> None:
    """One of the agent's calls, held, and the Recorder killed at `point` of its life."""
    subject = f"killed while {point}"
    sample_servers.set_mode("mail", delay_ms=3000 if point == "sending" else 0,
                            answer_delay_ms=3000 if point == "answered" else 0)
    box = {}
    thread = agent_call(url, token, email(point), box)
    wait_for(lambda: subject_steps(point).filter(status="held").exists(), f"the {point} call held")
    action = wait_for(lambda: ActionRequest.objects.filter(arguments__subject=subject).first(),
                      f"the {point} call's approval request")
    if point != "held":
        decide(action, approver_user, "approve")
    if point == "sending":  # released: the server has it, and waits before it acts
        wait_for(lambda: subject_steps(point).filter(status="pending").exists(), "the release")
    if point == "answered":  # the server acted, and holds its answer back
        wait_for(lambda: subject in mailed(sample_servers), "the server acting")
    kill_the_recorder(master, url)
    figures["kills"] += 1
    thread.join(timeout=60)
    figures["agents cut off"] += "error" in box
    if point == "held":
        decide(action, approver_user, "approve")


def mailed(sample_servers) -> collections.Counter:
    return collections.Counter(e["subject"] for e in sample_servers.ledger("mail") if e["op"] == "send_email")


@needs_redis
def test_killing_the_recorder_at_every_point_of_a_held_calls_life_sends_nothing_unrecorded_or_twice(
        sample_servers, dana, admin_user, approver_user, tmp_path, monkeypatch):
    register_samples(sample_servers, names=("mail",))
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)
    set_policy(admin_user)
    monkeypatch.setenv("RECORDER_HOLD_WAIT_SECONDS", "30")  # each call waits in its request, to be killed
    figures = collections.Counter()
    with open(tmp_path / "recorder.log", "w") as log, recorder_processes(2, log) as (url, master):
        for point in POINTS:
            kill_while(point, url, token, master, sample_servers, approver_user, figures)
        sample_servers.set_mode("mail")
        time.sleep(3.5)  # what the server was holding (its delays) is done by now
        later = timezone.now() + timedelta(seconds=ports.HOLD_LOST_SECONDS + 60)
        services.reconcile_stale_steps(older_than=later, now=later)
        policy = AutonomyPolicy.objects.get()
        policy.ask_timeout = 1  # a call made again that is held again is told at once
        approver_services.save_policy(row=policy, by=admin_user)
        for point in POINTS:  # the agent makes each call once more: an unused approval lets it through
            box = {}
            agent_call(url, token, email(point), box).join(timeout=60)
            figures["went through after"] += "result" in box and not box["result"].is_error

    ledger = mailed(sample_servers)
    twice = sum(n > 1 for n in ledger.values())
    unrecorded, said_never = 0, []
    for point in POINTS:
        steps = list(subject_steps(point).values_list("number", "status", "failure_class", "held_end"))
        sent_by_record = [s for s in steps if s[1] in SENT and s[2] != "policy"]
        if ledger[f"killed while {point}"] and not sent_by_record:
            unrecorded += 1
            said_never.append((point, steps))
        assert len(sent_by_record) <= 1, (point, steps)  # one approval, one call on the record
    for run in {step.run for step in Step.objects.select_related("run")}:
        assert services.verify_run(run=run).ok
    print(f"\nkilled held calls ({connection.vendor}): {figures['kills']} kills ({', '.join(POINTS)}), "
          f"{figures['agents cut off']} agents cut off, {sum(ledger.values())} emails sent: {unrecorded} "
          f"sent that the record says were not, {twice} sent twice; {figures['went through after']} calls "
          "made again went through")
    assert (unrecorded, twice) == (0, 0), said_never
    # The call killed while held was never sent; approved afterwards, the agent's next call sent it once.
    assert ledger["killed while held"] == 1
    assert subject_steps("held").filter(held_end=ports.HeldEnd.LOST).count() == 1


@needs_redis
def test_a_held_call_an_agent_has_as_a_task_is_taken_over_when_its_recorder_is_killed(
        sample_servers, dana, admin_user, approver_user, tmp_path):
    """A 2026 agent that declared tasks has its held call as a task; every Recorder process is killed while
    it waits for approvers. A new process takes the wait over (exactly one: the step is marked alive again,
    and the reconciler leaves it alone); ana approves; the call is sent once, its outcome journaled, and the
    agent's `tasks/get`, to whichever process answers, gets the server's real result."""
    from tests.journal.test_task_calls import call as task_call
    from tests.journal.test_task_calls import rpc

    register_samples(sample_servers, names=("mail",))
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)
    set_policy(admin_user)
    point = "held as a task"
    with open(tmp_path / "recorder.log", "w") as log, recorder_processes(2, log) as (url, master):
        handle = task_call(url, "mail__send_email", email(point), token=token)["result"]
        assert handle["status"] == "working" and handle["taskId"].startswith("held:"), handle
        wait_for(lambda: subject_steps(point).filter(status="held", held_task=True).exists(), "the call held")
        kill_the_recorder(master, url)
        killed_at = timezone.now()
        taken = wait_for(lambda: subject_steps(point).filter(status="held", held_seen_at__gt=killed_at)
                         .first(), "a new Recorder process taking the wait over", timeout=60)
        assert services.reconcile_stale_steps(older_than=timezone.now()) == 0  # alive: left alone
        assert mailed(sample_servers)[f"killed while {point}"] == 0
        action = ActionRequest.objects.get(arguments__subject=f"killed while {point}")
        decide(action, approver_user, "approve")
        step = wait_for(lambda: subject_steps(point).filter(pk=taken.pk, status="ok").first(),
                        "the approved call's outcome", timeout=30)
        for _ in range(4):  # any process answers from the record
            answer = rpc(url, "tasks/get", {"taskId": handle["taskId"]}, name=handle["taskId"], token=token)
            assert answer["result"]["status"] == "completed", answer
            assert "Emailed 'killed while held as a task'" in answer["result"]["result"]["content"][0]["text"]
        time.sleep(2)
    assert mailed(sample_servers)[f"killed while {point}"] == 1
    entries = step.run.entries.filter(data__step=step.number).order_by("seq")
    assert list(entries.values_list("event", flat=True)) == ["call", "released", "result"]
    assert services.verify_run(run=step.run).ok
