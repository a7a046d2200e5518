"""The Recorder enforces the autonomy policies before a call reaches its tool server: allow forwards, deny
refuses and journals, ask holds the call until approvers sign it (through a real MCP client, with progress
notifications), and an approved call runs once. The sample servers' ledgers say what really happened."""

import threading
import time

import pytest
from django.conf import settings

from approver import policy, services, tasks
from approver.models import ActionRequest, AutonomyPolicy
from journal import services as journal_services
from journal.models import Step, ToolServer
from journal.record import idempotency
from tests.journal.helpers import post_stateless_call, register_samples, run_agent

from ..softkey import SoftKey
from .test_approvals import relying_party  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = {"to": "buyer@globex.example", "subject": "Welcome aboard, Globex", "body": "Hello"}


@pytest.fixture
def sales_bot(recorder, sample_servers, dana, monkeypatch):
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    register_samples(sample_servers, names=("crm", "mail", "legacy"))
    agent, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    return agent, token


def set_policy(admin, *, scope="everything", ask_timeout=30, quorum=1, **decisions) -> AutonomyPolicy:
    row = AutonomyPolicy(
        name=f"{scope} policy",
        scope=scope,
        decisions={**policy.DEFAULT_DECISIONS, **decisions},
        ask_timeout=ask_timeout,
        quorum=quorum,
    )
    return services.save_policy(row=row, by=admin)


def call(recorder, token, name, arguments, progress=None):
    async def script(client):
        return await client.call_tool(name, arguments, progress_callback=progress)

    return run_agent(recorder, token, script)


def sent_emails(sample_servers):
    return [e for e in sample_servers.ledger("mail") if e["op"] == "send_email"]


def in_background(fn):
    """Run the agent's call in a thread of its own while the test plays the approver."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()))
    thread.start()
    return thread, box


def held(timeout=10.0) -> ActionRequest:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        action = ActionRequest.objects.filter(state="pending").first()
        if action is not None:
            return action
        time.sleep(0.1)
    raise AssertionError("no call was held")


def decide(action, user, decision, reason=""):
    """`user` enrols a software passkey and signs their decision on the held call."""
    from webauthn.helpers import base64url_to_bytes

    key = SoftKey()
    services.enroll_passkey(user=user, name="key", credential=key.register(b"e" * 32), challenge=b"e" * 32)
    request, _ = services.begin_action_signing(action=action, user=user, decision=decision, reason=reason)
    return services.complete_action_signing(user=user, nonce=request.nonce,
                                            credential=key.sign(base64url_to_bytes(request.challenge)))


def test_allow_forwards_and_the_decision_is_journaled(recorder, sales_bot, sample_servers, admin_user):
    _, token = sales_bot
    set_policy(admin_user)
    result = call(recorder, token, "crm__update_deal", {"deal_id": "D-881", "stage": "Won"})
    assert not result.is_error
    step = Step.objects.get(tool="update_deal")
    assert step.policy_decision["decision"] == "allow" and step.policy_decision["class"] == "compensate_api"
    entry = step.run.entries.get(event="call")
    assert entry.data["policy"]["policy"]["name"] == "everything policy"


def test_deny_answers_with_a_tool_error_naming_the_policy_and_forwards_nothing(
    recorder, sales_bot, sample_servers, admin_user
):
    _, token = sales_bot
    set_policy(admin_user, none="deny")
    result = call(recorder, token, "mail__send_email", EMAIL)
    assert result.is_error
    text = result.content[0].text
    assert "denied by policy “everything policy” (every call)" in text and "Nothing was sent to mail" in text
    assert sent_emails(sample_servers) == []
    step = Step.objects.get(tool="send_email")
    assert (step.status, step.failure_class) == ("error", "policy") and step.policy_decision[
        "decision"
    ] == "deny"
    assert journal_services.verify_run(run=step.run).ok


def test_a_held_call_goes_through_once_an_approver_signs(recorder, sales_bot, sample_servers, admin_user,
                                                         approver_user, settings):
    """Within the wait inside the request (raised here from its 4 s by an admin whose agents wait longer)."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 30
    _, token = sales_bot
    set_policy(admin_user)
    progress = []

    async def noted(done, total, message):
        progress.append((done, total, message))

    thread, box = in_background(lambda: call(recorder, token, "mail__send_email", EMAIL, progress=noted))
    action = held()
    assert (action.tool, action.arguments, action.call_class) == ("send_email", EMAIL, "none")
    assert action.why["reason"] == "delivered to external recipients"
    time.sleep(1.2)  # the agent is kept informed while it waits
    assert sent_emails(sample_servers) == []
    decide(action, approver_user, "approve")
    thread.join(timeout=20)
    assert not box["result"].is_error
    assert len(sent_emails(sample_servers)) == 1
    assert progress and "Waiting for approval" in progress[0][2] and progress[0][1] == 30
    action.refresh_from_db()
    assert action.state == "used" and action.used_step.status == "ok"
    events = list(action.run.entries.order_by("seq").values_list("event", flat=True))
    assert events[-4:] == ["action_requested", "action_decision", "released", "result"]


def test_a_denied_held_call_is_refused_saying_by_whom_and_why(recorder, sales_bot, sample_servers, admin_user,
                                                              approver_user):
    _, token = sales_bot
    set_policy(admin_user)
    thread, box = in_background(lambda: call(recorder, token, "mail__send_email", EMAIL))
    decide(held(), approver_user, "reject", reason="wrong customer")
    thread.join(timeout=20)
    assert box["result"].is_error
    assert "ana denied this call: “wrong customer”" in box["result"].content[0].text
    assert sent_emails(sample_servers) == []
    step = Step.objects.get(tool="send_email")
    assert step.failure_class == "policy" and "wrong customer" in step.error_message


def test_a_held_call_times_out_with_the_url_and_the_next_identical_call_runs_once_approved(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    _, token = sales_bot
    set_policy(admin_user, ask_timeout=1)
    first = call(recorder, token, "mail__send_email", EMAIL)
    assert first.is_error
    action = ActionRequest.objects.get()
    assert f"awaits approval at http://localhost:8000/actions/{action.public_id}/" in first.content[0].text
    assert sent_emails(sample_servers) == []
    decide(action, approver_user, "approve")
    # Other arguments are another call: the approval binds the exact arguments.
    other = call(recorder, token, "mail__send_email", {**EMAIL, "to": "cto@globex.example"})
    assert other.is_error and ActionRequest.objects.count() == 2
    again = call(recorder, token, "mail__send_email", EMAIL)
    assert not again.is_error and len(sent_emails(sample_servers)) == 1
    # An approval lets one call through: the same call once more waits for a new approval.
    once_more = call(recorder, token, "mail__send_email", EMAIL)
    assert once_more.is_error and "awaits approval" in once_more.content[0].text
    assert len(sent_emails(sample_servers)) == 1
    # The run page tells each attempt's story from the held call's own state.
    from journal import ports

    steps = list(Step.objects.filter(tool="send_email", arguments=EMAIL).order_by("pk"))
    stories = ports.story().steps(steps)
    trails = [[part["what"] for part in stories[step.pk]["held"]["trail"]] for step in steps]
    assert trails == [
        ["held", "the agent was told it awaits approval; this attempt was not sent", "approved by ana",
         f"sent with the agent's next identical call (step {steps[1].number})"],
        ["held", "approved by ana", "sent"],
        ["held", "the agent was told it awaits approval; this attempt was not sent"],
    ], trails


def test_a_policy_change_applies_to_the_next_call(recorder, sales_bot, sample_servers, admin_user):
    _, token = sales_bot
    row = set_policy(admin_user, none="deny")
    assert call(recorder, token, "mail__send_email", EMAIL).is_error
    row.decisions = {**row.decisions, "none": "allow"}
    services.save_policy(row=row, by=admin_user)
    assert not call(recorder, token, "mail__send_email", EMAIL).is_error
    assert len(sent_emails(sample_servers)) == 1


def test_the_most_specific_policy_governs_the_recorder(recorder, sales_bot, sample_servers, admin_user):
    _, token = sales_bot
    set_policy(admin_user, none="deny", unknown="deny")
    mail = ToolServer.objects.get(name="mail")
    services.save_policy(
        row=AutonomyPolicy(
            name="Mail",
            scope="tool",
            server=mail,
            tool="send_email",
            decisions={**policy.DEFAULT_DECISIONS, "none": "allow"},
        ),
        by=admin_user,
    )
    assert not call(recorder, token, "mail__send_email", EMAIL).is_error
    ticket = call(recorder, token, "legacy__create_ticket", {"title": "hello"})  # declares nothing: unknown
    assert ticket.is_error and "does not say whether it can be undone" in ticket.content[0].text
    decisions = dict(Step.objects.values_list("tool", "policy_decision__policy__name"))
    assert decisions == {"send_email": "Mail", "create_ticket": "everything policy"}


def hold_email(agent, arguments=EMAIL):
    """Hold an email as the Recorder does (a step journaled as held, and its action request), without the
    agent waiting on it."""
    from django.utils import timezone

    mail = ToolServer.objects.get(name="mail")

    def decide_now(declaration, retry_of=None):
        return services.decide_call(agent_name=agent.name, server_name="mail", tool="send_email",
                                    declaration=declaration)

    opened = journal_services.open_step(
        agent=agent,
        run_key="run:held",
        server=mail,
        server_name="mail",
        tool="send_email",
        arguments=arguments,
        request_meta=None,
        now=timezone.now(),
        decide=decide_now,
    )
    action = services.request_for_held_call(
        agent=agent,
        server=mail,
        tool="send_email",
        arguments=arguments,
        decision=opened.policy,
        run_id=opened.run_id,
        step_id=opened.step_id,
    )
    return opened, action


@pytest.fixture
def held_email(sales_bot, admin_user):
    set_policy(admin_user, quorum=2)
    return hold_email(sales_bot[0])


def test_a_quorum_of_two_needs_two_approvers_and_the_agents_owner_cannot_approve(held_email, approver_user,
                                                                                 second_approver, dana):
    _, action = held_email
    assert action.quorum == 2
    dana.groups.add(approver_user.groups.get())  # even as an approver, she cannot approve her own agent
    assert services.action_refusal(action=action, user=dana) == (
        "The agent acts for you, so someone else must decide on its calls.")
    decide(action, approver_user, "approve")
    action.refresh_from_db()
    assert action.state == "pending"
    with pytest.raises(services.ActionRefused, match="already decided"):
        services.begin_action_signing(action=action, user=approver_user, decision="approve")
    decide(action, second_approver, "approve")
    action.refresh_from_db()
    assert action.state == "approved" and action.decided_by == "ana, bo"


def test_a_denial_needs_a_reason_and_a_tampered_signature_is_refused(held_email, approver_user):
    from webauthn.helpers import base64url_to_bytes

    _, action = held_email
    key = SoftKey()
    services.enroll_passkey(
        user=approver_user, name="key", credential=key.register(b"e" * 32), challenge=b"e" * 32
    )
    with pytest.raises(services.ActionRefused, match="Say why you deny it"):
        services.begin_action_signing(action=action, user=approver_user, decision="reject")
    request, _ = services.begin_action_signing(action=action, user=approver_user, decision="approve")
    forged = key.sign(base64url_to_bytes(request.challenge)[::-1])  # signs something else
    with pytest.raises(services.ActionRefused):
        services.complete_action_signing(user=approver_user, nonce=request.nonce, credential=forged)
    action.refresh_from_db()
    assert action.state == "pending" and not action.approvals.exists()


def test_approvers_are_told_of_a_held_call_once(held_email, approver_user, second_approver, dana):
    from django.core import mail as outbox

    _, action = held_email
    for user in (approver_user, second_approver, dana):
        user.email = f"{user.username}@acme.example"
        user.save()
    assert tasks.notify_action_requested(action.pk) == 1 and tasks.notify_action_requested(action.pk) == 0
    [message] = outbox.outbox
    assert sorted(message.to) == ["ana@acme.example", "bo@acme.example"]
    assert message.subject == "Held for approval: sales-bot wants send_email"
    assert f"/actions/{action.public_id}/" in message.body and "buyer@globex.example" in message.body


def test_the_run_page_shows_the_decision_and_a_held_call_left_by_a_dead_recorder_is_settled(
        held_email, client, on_call):
    from django.urls import reverse
    from django.utils import timezone

    from journal.ports import HOLD_LOST_SECONDS

    opened, action = held_email
    client.force_login(on_call)
    page = client.get(reverse("journal:run_detail", args=[action.run.public_id])).content.decode()
    assert (
        "Held for approval: mail__send_email cannot be undone (delivered to external recipients): a human "
        "must approve it first by policy “everything policy” (every call)." in page
    )
    assert "Waiting for an approver now." in page
    # Its process marks it while it waits: the reconciler leaves a marked hold alone, long as it may last.
    soon = timezone.now() + timezone.timedelta(seconds=HOLD_LOST_SECONDS + 5)
    assert journal_services.held_step_alive(step_id=opened.step_id, now=soon - timezone.timedelta(seconds=5))
    assert journal_services.reconcile_stale_steps(older_than=soon, now=soon) == 0
    # The Recorder died while it held the call: nobody marks it, and well before its 10 minutes are over the
    # reconciler settles it as never sent.
    later = soon + timezone.timedelta(seconds=HOLD_LOST_SECONDS)
    assert journal_services.reconcile_stale_steps(older_than=later, now=later) == 1
    step = Step.objects.get(pk=opened.step_id)
    assert (step.status, step.failure_class, step.held_end, step.error_message) == (
        "error", "policy", "lost",
        "The Recorder holding this call stopped (a restart or a crash) while it waited for approval: this "
        "attempt was never sent.")
    assert not journal_services.held_step_alive(step_id=opened.step_id, now=later)
    # Every page agrees: the run page no longer says anyone waits, and the held call (still open, since an
    # approval lets the agent's next identical call through) says its first attempt was never sent.
    page = client.get(reverse("journal:run_detail", args=[action.run.public_id])).content.decode()
    assert "Waiting for an approver now." not in page and "this attempt was never sent" in page
    held = client.get(reverse("approver:action_detail", args=[action.public_id])).content.decode()
    assert "Nobody is waiting for it now: the attempt at step 1 was not sent" in held
    assert "The Recorder holding this call stopped (a restart or a crash)" in held
    assert "the agent's next identical call goes through (once)" in held
    # Issue 44, finding 8: where it stands says why nobody waits, not "it was told to call again".
    assert "Waiting for approval; the agent is not waiting (the Recorder holding its call stopped)." in held


def test_a_long_hold_keeps_the_agents_connection_alive_and_delivers_the_answer(
    recorder, sales_bot, sample_servers, admin_user, approver_user, monkeypatch, settings
):
    """The agent's HTTP client gives up after 2 s of silence; the hold lasts longer (an admin raised the wait
    inside the request). The Recorder answers the waiting call as an event stream with keep-alive comments,
    then the result."""
    settings.RECORDER_HOLD_WAIT_SECONDS = 20
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from journal.mcp import fast_calls

    monkeypatch.setattr(fast_calls, "HOLD_PING_SECONDS", 0.5)
    _, token = sales_bot
    set_policy(admin_user, ask_timeout=20)

    async def impatient_client():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=2) as http:
            async with Client(
                streamable_http_client(f"{recorder.base}/mcp/", http_client=http), cache=None
            ) as c:
                return await c.call_tool("mail__send_email", EMAIL)

    thread, box = in_background(lambda: anyio.run(impatient_client))
    action = held()
    time.sleep(4)  # twice the client's patience
    decide(action, approver_user, "approve")
    thread.join(timeout=20)
    assert "result" in box and not box["result"].is_error
    assert len(sent_emails(sample_servers)) == 1
    assert recorder.app.fast_calls.answered >= 1


def test_the_readme_verifier_checks_a_held_calls_signed_decision(held_email, approver_user, second_approver,
                                                                 tmp_path):
    import json
    import subprocess
    import sys

    from tests.journal.test_run_record import export, readme_verifier

    opened, action = held_email
    decide(action, approver_user, "approve")
    decide(action, second_approver, "approve")
    path = export(action.run, tmp_path)
    script = readme_verifier(tmp_path)
    good = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip().endswith("2 signed approvals")
    # Claim the approval covered other arguments: the digest no longer matches what was signed.
    bundle = json.loads(path.read_text())
    bundle["approvals"][0]["digest"] = services.action_digest(
        agent="sales-bot",
        server="mail",
        tool="send_email",
        arguments={**EMAIL, "to": "everyone@globex.example"},
    )
    path.write_text(json.dumps(bundle))
    bad = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
    assert bad.returncode != 0 and "signed something else" in bad.stderr


def test_a_held_call_nobody_decided_in_time_expires(held_email):
    from django.utils import timezone

    _, action = held_email
    assert services.expire_held_calls() == 0
    later = action.expires_at + timezone.timedelta(seconds=1)
    assert tasks.expire_held_calls() == 0  # nothing is due yet
    assert services.expire_held_calls(now=later) == 1 and services.expire_held_calls(now=later) == 0
    action.refresh_from_db()
    assert action.state == "expired"
    assert action.run.entries.filter(event="action_expired").count() == 1
    # An identical call after that waits on a new request.
    agent = action.agent
    fresh = services.request_for_held_call(
        agent=agent,
        server=action.server,
        tool=action.tool,
        arguments=action.arguments,
        decision={"decision": "ask", "class": "none"},
        run_id=action.run_id,
        step_id=action.step_id,
        now=later,
    )
    assert fresh.pk != action.pk and fresh.state == "pending"


def test_the_policy_names_the_group_that_decides_on_held_calls(sales_bot, admin_user, on_call, approver_user,
                                                               client):
    from django.urls import reverse

    agent, _ = sales_bot
    row = set_policy(admin_user)
    row.approver_group = "on-call"
    services.save_policy(row=row, by=admin_user)
    _, action = hold_email(agent)
    assert action.approver_group == "on-call"
    assert (
        services.action_refusal(action=action, user=approver_user)
        == "Only on-call engineers decide on held calls."
    )
    key = SoftKey()
    services.enroll_passkey(user=on_call, name="key", credential=key.register(b"e" * 32), challenge=b"e" * 32)
    client.force_login(on_call)
    page = client.get(reverse("approver:action_detail", args=[action.public_id])).content.decode()
    assert "Approve this call with my passkey" in page
    begun = client.post(reverse("approver:action_sign_begin", args=[action.public_id]),
                        data={"decision": "approve"}, content_type="application/json")
    assert begun.status_code == 200 and begun.json()["nonce"]


def test_the_nav_tells_the_deciding_group_how_many_calls_wait(held_email, client, approver_user, on_call):
    from django.urls import reverse

    client.force_login(approver_user)
    page = client.get(reverse("journal:run_list")).content.decode()
    assert (
        'Held calls <span class="badge waiting" title="Waiting for a decision by your group">1</span>' in page
    )
    client.force_login(on_call)  # not the deciding group: no badge
    assert 'class="badge waiting"' not in client.get(reverse("journal:run_list")).content.decode()


def test_a_broker_that_is_down_does_not_fail_a_held_call_and_the_approvers_are_told_later(
        sales_bot, admin_user, approver_user, monkeypatch):
    from django.utils import timezone
    from kombu.exceptions import OperationalError

    agent, _ = sales_bot
    set_policy(admin_user)

    def broker_down(*args):
        raise OperationalError("Error 111 connecting to localhost:6379. Connection refused.")

    monkeypatch.setattr(tasks.notify_action_requested, "delay", broker_down)
    _, action = hold_email(agent)
    assert action.state == "pending" and not action.notified  # held, and on record, though nobody was told
    rung = []
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: rung.append(args))
    ActionRequest.objects.filter(pk=action.pk).update(
        created_at=timezone.now() - timezone.timedelta(minutes=2)
    )
    tasks.expire_held_calls()
    assert rung == [(action.pk,)]


# -- an approval covers exactly what goes out (issue 14, findings 3 to 5)
# -------------------------------------


def raw_call(recorder, token, name: str, arguments_json: str, meta_json: str = "") -> dict:
    """A tools/call on the stateless protocol, its arguments written as JSON text (what an SDK would not
    write: a big integer, a lone surrogate, 1e999, NaN); the tool result as a dict."""
    meta = '{"io.modelcontextprotocol/protocolVersion": "2026-07-28"%s}' % (
        ", " + meta_json if meta_json else ""
    )
    body = (f'{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {{"name": "{name}", '
            f'"arguments": {arguments_json}, "_meta": {meta}}}}}')
    response = post_stateless_call(recorder, token, name, body)
    assert response.status_code == 200, response.text
    return response.json()["result"]


def approved_then_timed_out(recorder, token, approver_user, arguments, **call_meta):
    """The agent's call is held and times out; an approver then approves it, so the agent's next identical
    call would go through."""
    first = call(recorder, token, "mail__send_email", arguments)
    assert first.is_error and "awaits approval" in first.content[0].text
    action = ActionRequest.objects.get(state="pending")
    decide(action, approver_user, "approve")
    action.refresh_from_db()
    assert action.state == "approved"
    return action


@pytest.mark.parametrize(("shown", "sent"), [
    ('"9007199254740993"', "9007199254740993"),
    ('"\\ufffd"', '"\\ud800"'),
    ('"inf"', "1e999"),
    ('"nan"', "NaN"),
])
def test_an_approval_of_the_normalised_value_does_not_let_the_raw_one_through(
        recorder, sales_bot, sample_servers, admin_user, approver_user, shown, sent):
    """Finding 3: approving {"account": "9007199254740993"} (the string shown) let {"account":
    9007199254740993}
    through, and the journal recorded the string the server never received."""
    import json

    _, token = sales_bot
    set_policy(admin_user, ask_timeout=1)
    arguments = {**EMAIL, "account": json.loads(shown)}
    action = approved_then_timed_out(recorder, token, approver_user, arguments)
    steps = Step.objects.count()
    raw = json.dumps(EMAIL)[:-1] + ', "account": ' + sent + "}"
    result = raw_call(recorder, token, "mail__send_email", raw)
    assert result["isError"] and "not I-JSON (RFC 7493) at /account" in result["content"][0]["text"]
    assert "Nothing was journaled or sent to mail" in result["content"][0]["text"]
    assert Step.objects.count() == steps and sent_emails(sample_servers) == []
    action.refresh_from_db()
    assert action.state == "approved"  # still there for the call it covers
    assert not call(recorder, token, "mail__send_email", arguments).is_error
    assert len(sent_emails(sample_servers)) == 1


def test_an_approval_covers_the_calls_meta_and_the_recorder_sets_its_idempotency_key(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    """Finding 4: an approved call repeated with extra `_meta` (another vendor's flags, an idempotencyKey the
    agent chose) went through, and servers act on `_meta`."""
    _, token = sales_bot
    set_policy(admin_user, ask_timeout=1)
    action = approved_then_timed_out(recorder, token, approver_user, EMAIL)
    extra = raw_call(
        recorder, token, "mail__send_email", json_text(EMAIL), '"vendor.example/flags": {"bcc": "all"}'
    )
    assert extra["isError"] and "awaits approval" in extra["content"][0]["text"]
    assert sent_emails(sample_servers) == []
    other = ActionRequest.objects.get(state="pending")
    assert other.meta == {"vendor.example/flags": {"bcc": "all"}} and other.digest != action.digest

    # The agent's own runId and idempotencyKey are the Recorder's on a held call: the approval is matched
    # without them, and the server gets the approval's own key.
    chosen = raw_call(recorder, token, "mail__send_email", json_text(EMAIL),
                      '"hatp/journal": {"idempotencyKey": "key-of-an-earlier-email", "runId": "batch-7"}')
    assert not chosen["isError"], chosen
    [email] = sent_emails(sample_servers)
    # The approval's key names it and carries a MAC nobody without the secret key can work out (issue 22,
    # finding 16): an agent told the held call's id cannot send that key first.
    key = idempotency.recorder_key(idempotency.secret(settings.SECRET_KEY), "held-call", action.public_id)
    assert email["idempotencyKey"] == key and key.startswith(f"held-call:{action.public_id}:")
    action.refresh_from_db()
    released = action.used_step.run.entries.get(event="released", data__step=action.used_step.number)
    assert released.data["meta"] == {"hatp/journal": {"idempotencyKey": key}}


def json_text(value) -> str:
    import json

    return json.dumps(value)


def test_a_held_call_approval_does_not_outlive_the_approvers_passkey(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    """Finding 5: after the approver revoked their passkeys, the identical call still went through (plans
    re-check their approvals before they run; held calls did not)."""
    from approver.models import Passkey

    _, token = sales_bot
    set_policy(admin_user, ask_timeout=1)
    action = approved_then_timed_out(recorder, token, approver_user, EMAIL)
    for passkey in Passkey.objects.filter(user=approver_user):
        services.revoke_passkey(passkey=passkey)
    again = call(recorder, token, "mail__send_email", EMAIL)
    assert again.is_error and "awaits approval" in again.content[0].text
    assert sent_emails(sample_servers) == []
    action.refresh_from_db()
    assert action.state == "pending" and action.decided_by == ""
    lapsed = action.run.entries.get(event="action_lapsed")
    assert lapsed.data["action"] == str(action.public_id) and lapsed.data["counting"] == []


def test_a_held_call_approval_lapses_when_the_approver_leaves_the_group(
        recorder, sales_bot, sample_servers, admin_user, approver_user):
    _, token = sales_bot
    set_policy(admin_user, ask_timeout=1)
    action = approved_then_timed_out(recorder, token, approver_user, EMAIL)
    approver_user.groups.clear()
    assert call(recorder, token, "mail__send_email", EMAIL).is_error
    action.refresh_from_db()
    assert action.state == "pending" and sent_emails(sample_servers) == []
