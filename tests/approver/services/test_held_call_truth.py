"""A held call's record is true whatever the agent does: hostile agents (one that stops reading its stream,
one whose framework gives up, one that hangs up) through the real Recorder, judged by the mail server's
ledger. A held call is a state machine in the database; the agent's request only waits briefly."""

import json
import socket
import threading
import time
from datetime import timedelta

import anyio
import httpx2
import pytest
from mcp import MCPError

from approver import services
from approver.models import ActionRequest
from journal import services as journal_services
from journal.models import Step
from journal.ports import HOLD_LOST_SECONDS
from tests.journal.helpers import agent_client, run_agent, settle
from tests.services import needs_python_clients

from .test_held_calls import EMAIL, call, decide, held, sales_bot, sent_emails, set_policy

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["sales_bot"]  # a fixture, used by name

HANDSHAKE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}}}


def wait_for(predicate, timeout: float = 20.0, what: str = "it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen in {timeout} s")


def open_session(recorder, token: str) -> str:
    """A handshake session, raw: the session id for the requests the test makes by hand."""
    headers = {"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"}
    opened = httpx2.post(f"{recorder.base}/mcp/", json=HANDSHAKE, headers=headers, timeout=10)
    session = opened.headers["mcp-session-id"]
    httpx2.post(f"{recorder.base}/mcp/", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                headers={**headers, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"},
                timeout=10)
    return session


def send_and_stop_reading(recorder, token: str, session: str, body: bytes) -> socket.socket:
    """POST `body` on a socket that reads the response's first bytes and then nothing more, with a receive
    buffer as small as the kernel allows: what the Recorder streams back piles up until it cannot write."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", recorder.port))
    head = (f"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1:{recorder.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Mcp-Session-Id: {session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    sock.recv(64)  # the answer has begun (an event stream): from here on, nothing is read
    return sock


def test_an_agent_that_stops_reading_its_stream_cannot_stall_the_hold_nor_have_a_call_sent_unrecorded(
        recorder, sales_bot, sample_servers, admin_user, approver_user, settings):
    """Finding 1: a 1 MB progress token and a stream nobody reads used to stall the hold on a progress
    notification (once the SDK's 16 buffered messages of the request are full); the reconciler then said
    "never sent", and an approval let the stalled loop send it. The wait is raised here to 15 s, so far
    more notifications are due than any buffer takes."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 15
    _, token = sales_bot
    set_policy(admin_user)
    session = open_session(recorder, token)
    token_of_a_megabyte = "p" * 1_000_000
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "mail__send_email", "arguments": EMAIL, "_meta": {"progressToken": token_of_a_megabyte}}})
    sock = send_and_stop_reading(recorder, token, session, body.encode())
    try:
        action = held()
        # The Recorder closes the attempt itself after its short wait, stalled stream or not.
        step = wait_for(lambda: Step.objects.filter(tool="send_email").exclude(status="held").first(),
                        timeout=30, what="the Recorder closing the held attempt")
        assert (step.status, step.held_end) == ("error", "told")
        assert "awaits approval at" in step.error_message and "Nothing was sent" in step.error_message
        # A later reconciler has nothing to say of it, and an approval cannot make the closed attempt go out.
        later = step.finished_at + timedelta(seconds=HOLD_LOST_SECONDS * 3)
        assert journal_services.reconcile_stale_steps(older_than=later, now=later) == 0
        decide(action, approver_user, "approve")
        time.sleep(2)
    finally:
        sock.close()
    time.sleep(1)
    assert sent_emails(sample_servers) == []
    step.refresh_from_db()
    assert (step.status, step.held_end) == ("error", "told")
    action.refresh_from_db()
    assert action.state == "approved"  # unused: it is the agent's next identical call's
    again = call(recorder, token, "mail__send_email", EMAIL)
    assert not again.is_error and len(sent_emails(sample_servers)) == 1
    sent = Step.objects.get(tool="send_email", status="ok")  # in the new session's run
    action.refresh_from_db()
    assert (action.state, action.used_step_id) == ("used", sent.pk)
    assert journal_services.verify_run(run=sent.run).ok and journal_services.verify_run(run=step.run).ok


def test_an_approval_is_never_claimed_for_an_attempt_the_record_says_was_never_sent(
        sales_bot, admin_user, approver_user):
    """The state machine's rule, without a Recorder: the reconciler settles a held attempt as never sent, an
    approver signs after, and the claim of that attempt releases nothing (the approval stays for the next
    identical call)."""
    from django.utils import timezone

    from .test_held_calls import hold_email

    set_policy(admin_user)
    opened, action = hold_email(sales_bot[0])
    later = timezone.now() + timezone.timedelta(seconds=HOLD_LOST_SECONDS + 5)
    assert journal_services.reconcile_stale_steps(older_than=later, now=later) == 1
    decide(action, approver_user, "approve")
    assert services.claim_approved_action(action_id=action.pk, opened=opened, meta=None) is False
    step = Step.objects.get(pk=opened.step_id)
    action.refresh_from_db()
    assert (step.status, step.held_end, action.state) == ("error", "lost", "approved")
    assert not step.run.entries.filter(event="released").exists()


def test_a_client_whose_timeout_is_shorter_than_the_wait_is_journaled_as_having_stopped_waiting(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    """Finding 2: an agent framework that gives up (its read timeout, 2 s here) is journaled as exactly that,
    never as a Recorder restart, and the approval still lets its next identical call through once."""
    _, token = sales_bot
    set_policy(admin_user)

    async def impatient(client):
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("mail__send_email", EMAIL, read_timeout_seconds=2)

    run_agent(recorder, token, impatient)
    step = wait_for(lambda: Step.objects.filter(tool="send_email").exclude(status="held").first(),
                    what="the hang-up journaled")
    assert (step.status, step.held_end, step.failure_class) == ("error", "hung_up", "policy")
    assert step.error_message == "The agent stopped waiting after 2 s; nothing was sent."
    entry = step.run.entries.filter(event="result").last()
    assert entry.data["held"] == "hung_up" and entry.data["forwarded"] is False
    decide(ActionRequest.objects.get(), approver_user, "approve")
    assert not call(recorder, token, "mail__send_email", EMAIL).is_error
    assert len(sent_emails(sample_servers)) == 1


def test_an_agent_with_a_five_second_timeout_hears_where_its_call_waits_in_time(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    """The OpenAI Agents SDK's MCP client gives up after 5 s: it is told within that, in words and in the
    Recorder's own `hatp/journal` keys, that the call awaits approval, where, and to call again; once approved
    its next identical call goes through once, and the record tells it: held → told → approved by ana → sent
    → its outcome."""
    _, token = sales_bot
    set_policy(admin_user)

    async def five_seconds(client):
        started = time.monotonic()
        result = await client.call_tool("mail__send_email", EMAIL, read_timeout_seconds=5)
        return result, time.monotonic() - started

    result, took = run_agent(recorder, token, five_seconds)
    action = ActionRequest.objects.get()
    assert result.is_error and took < 5
    text = result.content[0].text
    assert f"awaits approval at http://localhost:8000/actions/{action.public_id}/" in text
    assert "Make the same call again" in text and "Nothing was sent" in text
    journal = result.meta["hatp/journal"]
    assert journal["heldCall"]["url"] == f"http://localhost:8000/actions/{action.public_id}/"
    assert journal["heldCall"]["state"] == "pending"
    assert journal["recovery"]["action"] == "backoff" and journal["recovery"]["retryable"] is True
    assert sent_emails(sample_servers) == []
    decide(action, approver_user, "approve")
    result, took = run_agent(recorder, token, five_seconds)
    assert not result.is_error and took < 5
    assert len(sent_emails(sample_servers)) == 1
    assert call(recorder, token, "mail__send_email", EMAIL).is_error  # one approval, one call
    assert len(sent_emails(sample_servers)) == 1
    from journal import ports

    first, second, third = Step.objects.filter(tool="send_email").order_by("number")
    stories = ports.story().steps([first, second])
    assert [part["what"] for part in stories[first.pk]["held"]["trail"]] == [
        "held", "the agent was told it awaits approval; this attempt was not sent", "approved by ana",
        f"sent with the agent's next identical call (step {second.number})"]
    trail = [part["what"] for part in stories[second.pk]["held"]["trail"]]
    assert trail == ["held", "approved by ana", "sent"]
    assert (first.held_end, second.status, third.held_end) == ("told", "ok", "told")
    events = list(second.run.entries.filter(data__step=second.number).order_by("seq")
                  .values_list("event", flat=True))
    assert events == ["call", "released", "result"]


def test_an_agent_that_hangs_up_on_the_stateless_protocol_is_journaled_as_having_stopped_waiting(
        recorder, sales_bot, sample_servers, admin_user):
    """A 2026-07-28 agent cancels by closing its request's connection (its framework gave up): the attempt
    is closed at once as the agent's, not left for the reconciler to blame on a restart."""
    _, token = sales_bot
    set_policy(admin_user)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "mail__send_email", "arguments": EMAIL,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}})

    def post():
        with pytest.raises(httpx2.TimeoutException):
            httpx2.post(f"{recorder.base}/mcp/", content=body.encode(), timeout=1.5, headers={
                "authorization": f"Bearer {token}", "content-type": "application/json",
                "accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/call", "mcp-name": "mail__send_email"})

    thread = threading.Thread(target=post)
    thread.start()
    thread.join(timeout=10)
    step = wait_for(lambda: Step.objects.filter(tool="send_email").exclude(status="held").first(),
                    what="the hang-up journaled")
    assert (step.held_end, step.status) == ("hung_up", "error")
    assert step.error_message.startswith("The agent stopped waiting after ")
    assert sent_emails(sample_servers) == []


def test_a_release_cancelled_before_it_is_sent_is_told_as_such(sales_bot, admin_user, approver_user):
    """Released by an approval, then cancelled by the agent before it went out: the held call's trail says
    it was not sent after all, never "sent"."""
    from django.utils import timezone

    from journal import ports
    from journal.record.journaling import Outcome

    from .test_held_calls import hold_email

    set_policy(admin_user)
    opened, action = hold_email(sales_bot[0])
    decide(action, approver_user, "approve")
    assert services.claim_approved_action(action_id=action.pk, opened=opened, meta=None) is True
    why = "The agent cancelled the call before it was sent to mail; nothing was sent."
    journal_services.close_step(opened=opened, started=timezone.now(), finished=timezone.now(),
                                outcome=Outcome(may_have_acted=False, cancelled=why))
    step = Step.objects.get(pk=opened.step_id)
    trail = [part["what"] for part in ports.story().steps([step])[step.pk]["held"]["trail"]]
    assert trail[-1] == f"released for step {step.number}, which was not sent after all: {why}"
    assert "sent" not in trail


def test_the_agent_is_told_while_it_waits_only_as_fast_as_it_reads(
        recorder, sales_bot, sample_servers, admin_user, settings):
    """Progress notifications go to a reading agent while its call waits, each within a bound."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 2
    _, token = sales_bot
    set_policy(admin_user)
    seen = []

    async def noted(done, total, message):
        seen.append((total, message))

    async def main():
        async with agent_client(recorder, token) as client:
            return await client.call_tool("mail__send_email", EMAIL, progress_callback=noted)

    result = anyio.run(main)
    settle(recorder)
    assert result.is_error and "awaits approval" in result.content[0].text
    assert seen
    assert all(total == 2 and message.startswith("Waiting for approval: ") for total, message in seen)


def openai_agent(recorder, token: str, tool: str, arguments: dict, run_id: str) -> dict:
    """One tool call made by the OpenAI Agents SDK (pinned, in its own environment), as its agent run makes
    it: what its model would read, and how long it took."""
    import subprocess
    from pathlib import Path

    from tests.services import client_python

    probe = Path(__file__).resolve().parents[2] / "clients" / "openai_agents_probe.py"
    done = subprocess.run([client_python("openai-agents"), str(probe), f"{recorder.base}/mcp/", token, tool,
                           json.dumps(arguments), run_id], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    settle(recorder)
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_python_clients
def test_the_openai_agents_sdk_hears_where_its_call_waits_and_its_next_identical_call_goes_through_once(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    """Its MCP client gives up after 5 s, long before any person decides: the agent's model reads, within
    that, where the call waits and what to do; once ana approves, the agent's next identical call goes
    through once, and the run's record says held → told → approved by ana → sent → its outcome."""
    from journal import ports

    _, token = sales_bot
    set_policy(admin_user)
    first = openai_agent(recorder, token, "mail__send_email", EMAIL, "globex-welcome")
    action = ActionRequest.objects.get()
    assert first["failed"] == "" and first["seconds"] < 5
    assert f"awaits approval at http://localhost:8000/actions/{action.public_id}/" in first["seen"]
    assert "Make the same call again" in first["seen"] and sent_emails(sample_servers) == []
    decide(action, approver_user, "approve")
    second = openai_agent(recorder, token, "mail__send_email", EMAIL, "globex-welcome")
    assert second["failed"] == "" and "Emailed 'Welcome aboard, Globex'" in second["seen"]
    third = openai_agent(recorder, token, "mail__send_email", EMAIL, "globex-welcome")
    assert "awaits approval" in third["seen"]
    assert len(sent_emails(sample_servers)) == 1
    told, sent, again = Step.objects.filter(tool="send_email").order_by("number")
    assert told.run_id == sent.run_id == again.run_id and told.run.key == "run:globex-welcome"
    assert (told.held_end, sent.status, again.held_end) == ("told", "ok", "told")
    stories = ports.story().steps([told, sent])
    assert [part["what"] for part in stories[told.pk]["held"]["trail"]] == [
        "held", "the agent was told it awaits approval; this attempt was not sent", "approved by ana",
        f"sent with the agent's next identical call (step {sent.number})"]
    assert [part["what"] for part in stories[sent.pk]["held"]["trail"]] == ["held", "approved by ana", "sent"]
    released = sent.run.entries.get(event="released")
    assert released.data["approvedBy"] == "ana" and released.data["step"] == sent.number
    assert sent.run.entries.filter(event="result", data__step=sent.number).get().data["status"] == "ok"


def held_task_until(recorder, token: str, handle: str, status: str, timeout: float = 20) -> dict:
    from tests.journal.test_task_calls import rpc

    deadline = time.monotonic() + timeout
    while True:
        answer = rpc(f"{recorder.base}/mcp/", "tasks/get", {"taskId": handle}, name=handle, token=token)
        if answer["result"]["status"] == status:
            return answer["result"]
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_2026_agent_that_declared_tasks_gets_a_task_that_ends_with_the_real_result_or_the_denial(
        recorder, sales_bot, sample_servers, admin_user, approver_user, decision):
    """Issue 43, build item 2: a task-capable 2026 client is not told to call again: it gets a task handle at
    once, `tasks/get` says where the call waits, and once ana decides, the Recorder sends the call itself
    (once) and the task completes with the server's real result, or with the denial."""
    from tests.journal.test_task_calls import call as task_call

    _, token = sales_bot
    set_policy(admin_user)
    started = time.monotonic()
    handle = task_call(f"{recorder.base}/mcp/", "mail__send_email", EMAIL, token=token)["result"]
    assert time.monotonic() - started < 3  # at once, not after the hold's wait
    action = ActionRequest.objects.get()
    assert handle["resultType"] == "task" and handle["taskId"] == f"held:{action.public_id}"
    assert handle["status"] == "working" and f"/actions/{action.public_id}/" in handle["statusMessage"]
    waiting = held_task_until(recorder, token, handle["taskId"], "working")
    assert "Waiting for approval" in waiting["statusMessage"] and sent_emails(sample_servers) == []
    decide(action, approver_user, decision, reason="" if decision == "approve" else "not this customer")
    done = held_task_until(recorder, token, handle["taskId"], "completed")
    step = Step.objects.get()
    if decision == "approve":
        assert done["result"].get("isError") is not True and len(sent_emails(sample_servers)) == 1
        assert step.status == "ok" and step.held_call == str(action.public_id)
        events = list(step.run.entries.filter(data__step=step.number).order_by("seq")
                      .values_list("event", flat=True))
        assert events == ["call", "released", "result"]
    else:
        said = done["result"]["content"][0]["text"]
        assert done["result"]["isError"] is True and "not this customer" in said
        assert sent_emails(sample_servers) == [] and step.held_end == "denied"
    time.sleep(1)
    assert len(sent_emails(sample_servers)) == (1 if decision == "approve" else 0)  # once, never again


def test_a_held_call_as_a_task_whose_agent_never_asks_again_is_still_sent_once_and_journaled(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    """A sequence: a 2026 agent that declared tasks gets its handle and hangs up, never to ask about it. ana
    approves: the Recorder sends the call itself, once, and journals its outcome; the record says held →
    approved by ana → sent → ok, and a `tasks/get` long after still gets the real result."""
    from tests.journal.test_task_calls import call as task_call

    _, token = sales_bot
    set_policy(admin_user)
    handle = task_call(f"{recorder.base}/mcp/", "mail__send_email", EMAIL, token=token)["result"]
    action = ActionRequest.objects.get()
    assert handle["taskId"] == f"held:{action.public_id}" and sent_emails(sample_servers) == []
    decide(action, approver_user, "approve")
    step = wait_for(lambda: Step.objects.filter(status="ok").first(), what="the approved call's outcome")
    assert len(sent_emails(sample_servers)) == 1
    entries = step.run.entries.filter(data__step=step.number).order_by("seq")
    assert list(entries.values_list("event", flat=True)) == ["call", "released", "result"]
    assert step.run.entries.get(event="released").data["approvedBy"] == "ana"
    later = held_task_until(recorder, token, handle["taskId"], "completed")
    assert "Emailed 'Welcome aboard, Globex'" in later["result"]["content"][0]["text"]
    time.sleep(1)
    assert len(sent_emails(sample_servers)) == 1


def test_two_held_calls_on_one_record_are_each_decided_and_sent_at_most_once(
        recorder, sales_bot, sample_servers, admin_user, approver_user, settings, client):
    """A sequence: two calls on the same deal (its stage, then its amount) are both held and the agent told
    of each. ana approves the first and denies the second. The agent makes both again: the first goes through
    once; the second is not sent (it waits anew, as a new held call). The CRM's ledger has one change, and
    each held step's trail says how it ended."""
    from journal import ports

    settings.RECORDER_HOLD_WAIT_SECONDS = 0.5
    _, token = sales_bot
    set_policy(admin_user, compensate_api="ask")
    stage, amount = {"deal_id": "D-881", "stage": "Won"}, {"deal_id": "D-881", "amount": 52000}
    for arguments in (stage, amount):
        told = call(recorder, token, "crm__update_deal", arguments)
        assert told.is_error and "awaits approval" in told.content[0].text
    first, second = ActionRequest.objects.order_by("created_at")
    decide(first, approver_user, "approve")
    decide(second, approver_user, "reject", reason="the amount is agreed already")
    sent = call(recorder, token, "crm__update_deal", stage)
    refused = call(recorder, token, "crm__update_deal", amount)
    assert not sent.is_error and refused.is_error
    changes = [entry for entry in sample_servers.ledger("crm") if entry["op"] == "update_deal"]
    assert len(changes) == 1 and "stage" in json.dumps(changes[0])
    steps = list(Step.objects.filter(tool="update_deal").order_by("number"))
    stories = ports.story().steps(steps)
    trails = [[part["what"] for part in stories[step.pk]["held"]["trail"]] for step in steps]
    assert trails[0][-2:] == ["approved by ana",
                              f"sent with the agent's next identical call (step {steps[2].number})"]
    assert any(part.startswith("denied by ana") for part in trails[1]), trails[1]
    assert steps[2].status == "ok" and steps[3].status != "ok" and steps[3].held_call not in ("", None)
    assert steps[3].held_call != str(second.public_id)  # a new held call: a denial is not reused
    # Issue 44, finding 10: the run page says how each held step stands now, not "Held for approval".
    client.force_login(approver_user)
    page = client.get(f"/runs/{steps[0].run.public_id}/").content.decode()
    held = [page.split(f'id="step-{step.number}"', 1)[1].split('<p class="policy ', 1)[1][:80]
            for step in steps]
    assert held[0].startswith('decision-settled">Held for approval, then approved and sent:'), held[0]
    assert held[1].startswith('decision-settled">Held for approval, then denied:'), held[1]
    assert held[3].startswith('decision-ask">Held for approval:'), held[3]  # waits anew


def test_a_held_calls_page_and_the_list_say_where_it_stands_and_what_came_of_it(
        recorder, sales_bot, sample_servers, admin_user, approver_user, settings, client):
    """Issue 44, finding 8: a held call said "Approved and made by ana" for a call the server refused, and
    the list said "Waiting for approval" for a call nobody waited for."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 0.5
    _, token = sales_bot
    set_policy(admin_user)
    told = call(recorder, token, "mail__send_email", EMAIL)
    assert told.is_error and "awaits approval" in told.content[0].text
    action = ActionRequest.objects.get()
    client.force_login(approver_user)
    listed = client.get("/actions/").content.decode()
    assert "Waiting for approval; the agent is not waiting (it was told to call again once approved)." \
        in listed
    decide(action, approver_user, "approve")
    sample_servers.set_mode("mail", "rpc_error")

    async def refused(client):
        try:
            return await client.call_tool("mail__send_email", EMAIL)
        except MCPError as exc:  # the server's own JSON-RPC error, relayed
            return exc

    assert isinstance(run_agent(recorder, token, refused), MCPError)
    action.refresh_from_db()
    used = Step.objects.filter(tool="send_email").order_by("number").last()
    assert action.state == "used" and action.used_step_id == used.pk
    page = client.get(f"/actions/{action.public_id}/").content.decode()
    made = f"Sent by the agent after ana&#x27;s approval (step {used.number}); the server refused it: "
    assert made in page
    assert "Approved by ana, and sent" in page and "the server did it" not in page
    assert f"the server refused it: {used.error_message[:40]}".replace("'", "&#x27;") in \
        client.get("/actions/").content.decode()
