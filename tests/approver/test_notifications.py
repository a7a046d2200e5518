"""Approvers hear when a plan is ready (email and a Slack-compatible webhook); requesters hear the outcome."""

import re
import smtplib

import pytest
from django.core import mail
from django.test import Client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from approver import notifications, services, tasks
from approver.models import Plan
from approver.services import bell
from journal import services as journal_services
from tests.conftest import ServerThread, free_port
from tests.journal.factories import crm_server, make_run

from .services.test_approvals import approve, enrolled, relying_party, sign  # noqa: F401 - fixtures and helpers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def webhook():
    """A stand-in for Slack's incoming webhook on this machine: it keeps what it is sent."""
    received, status = [], {"code": 200}

    async def hook(request: Request):
        received.append(await request.json())
        return JSONResponse({"ok": status["code"] == 200}, status_code=status["code"])

    with ServerThread(Starlette(routes=[Route("/hook", hook, methods=["POST"])]), free_port()) as thread:
        yield f"{thread.base}/hook", received, status


@pytest.fixture
def emails(approver_user, second_approver, on_call, dana):
    for user in (approver_user, second_approver, on_call, dana):
        user.email = f"{user.username}@acme.example"
        user.save()


def ready_plan(globex, on_call, monkeypatch):
    rung = []
    monkeypatch.setattr(tasks.notify_plan_ready, "delay", lambda *args: rung.append(args))
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert rung == [(plan.pk, plan.check_round)]  # the worker is asked once the plan is ready
    return plan


def test_approvers_get_an_email_and_the_webhook_a_message_once(globex, on_call, emails, webhook, settings,
                                                               monkeypatch):
    url, received, _ = webhook
    settings.APPROVAL_WEBHOOK_URL, settings.PUBLIC_URL = url, "https://undo.acme.example"
    plan = ready_plan(globex, on_call, monkeypatch)
    assert tasks.notify_plan_ready(plan.pk, plan.check_round) == 1
    [message] = mail.outbox
    assert sorted(message.to) == ["ana@acme.example", "bo@acme.example"]  # not the requester, not Dana
    assert "Undo 2 actions by sales-bot for dana" in message.body
    # What signing undoes, each as the change it makes, in the order it is done.
    undoes = message.body.split("Signing undoes, in this order:\n")[1].split("\n")[:2]
    assert undoes[0].startswith("- Step 3: Cancel 'Kickoff with Globex'") and undoes[1].startswith(
        "- Step 2: Deal D-881 stage: Won → Proposal")  # its server's own words for the undo
    assert f"https://undo.acme.example/plans/{plan.public_id}/" in message.body
    assert len(received) == 1 and "ready for sign-off" in received[0]["text"]
    # A second run of the task sends nothing more.
    assert tasks.notify_plan_ready(plan.pk, plan.check_round) == 0
    assert len(mail.outbox) == 1 and len(received) == 1


def test_a_failing_webhook_does_not_stop_the_email(globex, on_call, emails, webhook, settings, monkeypatch):
    url, received, status = webhook
    settings.APPROVAL_WEBHOOK_URL, status["code"] = url, 500
    plan = ready_plan(globex, on_call, monkeypatch)
    assert tasks.notify_plan_ready(plan.pk, plan.check_round) == 1
    assert len(mail.outbox) == 1 and len(received) == 1


def test_the_requester_is_told_of_a_rejection_with_its_reason(globex, on_call, approver_user, emails,
                                                               monkeypatch):
    plan = ready_plan(globex, on_call, monkeypatch)
    told = []
    monkeypatch.setattr(tasks.notify_plan_decided, "delay", lambda *args: told.append(args))
    request, assertion = sign(plan, approver_user, enrolled(approver_user), decision="reject",
                              reason="the customer confirmed the deal")
    services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)
    assert told == [(plan.pk,)]
    assert tasks.notify_plan_decided(plan.pk) == 1 and tasks.notify_plan_decided(plan.pk) == 0
    [message] = mail.outbox
    assert message.to == ["olivia@acme.example"] and message.subject == "Your undo plan was rejected"
    assert "rejected by ana: “the customer confirmed the deal”" in message.body


def test_the_requester_hears_of_the_approval_even_when_the_worker_started_first(
        globex, on_call, approver_user, second_approver, emails, monkeypatch):
    from approver.models import Plan

    plan = ready_plan(globex, on_call, monkeypatch)
    monkeypatch.setattr(tasks.notify_plan_decided, "delay", lambda *args: None)
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={"3": "keep_newer"} if plan.conflict_count else {})
    Plan.objects.filter(pk=plan.pk).update(state="executing")  # the worker took the plan before this task ran
    assert tasks.notify_plan_decided(plan.pk) == 1
    [message] = mail.outbox
    assert message.subject == "Your undo plan was approved"
    assert "approved by ana and bo; it may now run" in message.body


def held_call(dana, tool: str):
    agent, _ = journal_services.create_agent(name="bot", on_behalf_of=dana)
    run = make_run(agent, steps=1)
    step = run.steps.first()
    return services.request_for_held_call(agent=agent, server=crm_server(), tool=tool, arguments={"to": "x"},
                                          decision={"decision": "ask", "class": "none"}, run_id=run.pk,
                                          step_id=step.pk)


def test_a_tool_name_with_line_breaks_cannot_stop_approvers_hearing_of_its_held_call(
        dana, emails, webhook, settings, monkeypatch):
    """The agent names its tools: "send\\r\\nBcc: …" once made the mail library refuse the whole message
    (BadHeaderError), and the webhook was skipped with it."""
    url, received, _ = webhook
    settings.APPROVAL_WEBHOOK_URL = url
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    action = held_call(dana, "send\r\nBcc: mallory@evil.example\r\n\r\nyour account is locked")
    assert tasks.notify_action_requested(action.pk) == 1
    [message] = mail.outbox
    assert "\r" not in message.subject and "\n" not in message.subject
    # The carriage returns are written out and flagged (issue 22, finding 3); the line breaks became spaces.
    assert message.subject.startswith(
        "Held for approval: bot wants [⚠ hidden characters written out as ⟨U+…⟩] send⟨U+000D⟩ Bcc: mallory@")
    assert message.to == ["ana@acme.example", "bo@acme.example"] and not message.bcc
    assert len(received) == 1 and "\n" not in received[0]["text"].split(".")[0]


def test_what_an_agent_names_stays_on_one_line_and_the_webhook_shows_it_literally(
        dana, emails, webhook, settings, monkeypatch):
    """Issue 22, finding 7: a tool name carrying a line break and a fake "Approve or deny: https://…" link
    landed as a line of its own in the approvers' mail, and `<!channel>` pinged a whole Slack channel."""
    url, received, _ = webhook
    settings.APPROVAL_WEBHOOK_URL = url
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    action = held_call(dana, "send\nApprove or deny: https://evil.example/approve <!channel> <https://evil.example|ok>")
    assert tasks.notify_action_requested(action.pk) == 1
    [message] = mail.outbox
    ours = [line for line in message.body.splitlines() if line.startswith("Approve or deny:")]
    assert ours == [f"Approve or deny: {notifications.action_url(action)}"]
    [posted] = received
    assert "<!channel>" not in posted["text"] and "&lt;!channel&gt;" in posted["text"]
    assert "<https://evil.example|ok>" not in posted["text"]


def test_a_failing_mail_server_does_not_stop_the_webhook_and_is_tried_again(
        dana, emails, webhook, settings, monkeypatch):
    url, received, _ = webhook
    settings.APPROVAL_WEBHOOK_URL = url
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    action = held_call(dana, "send_email")
    rung = []
    monkeypatch.setattr(
        bell, "ring", lambda task, *args, countdown=None: rung.append((task, args, countdown))
    )

    def down(*args, **kwargs):
        raise smtplib.SMTPServerDisconnected("the mail server went away")

    monkeypatch.setattr(notifications, "send_mail", down)
    assert tasks.notify_action_requested(action.pk) == 0  # no email went out
    assert len(received) == 1 and "bot wants send_email" in received[0]["text"]  # the webhook still did
    [(task, (channel, message, about, attempt), wait)] = rung
    assert (task, channel, attempt, wait) == (bell.RETRY_NOTICE, "email", 1, notifications.FIRST_WAIT)

    # The worker tries again later; with the mail server back, the approvers get it.
    monkeypatch.undo()
    monkeypatch.setattr(
        bell, "ring", lambda task, *args, countdown=None: rung.append((task, args, countdown))
    )
    assert tasks.retry_notice(channel, message, about, attempt) is True
    [sent] = mail.outbox
    assert sent.to == ["ana@acme.example", "bo@acme.example"] and "send_email" in sent.subject
    assert len(rung) == 1  # nothing more to retry


def test_a_notification_that_keeps_failing_is_retried_with_growing_waits_then_given_up(
        dana, settings, monkeypatch, caplog):
    settings.APPROVAL_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    rung = []
    monkeypatch.setattr(bell, "ring", lambda task, *args, countdown=None: rung.append((args, countdown)))
    attempt = 0
    assert notifications.webhook("hello", about="a test") is False
    while rung:
        (channel, message, about, attempt), wait = rung.pop()
        assert channel == "webhook" and wait == notifications.FIRST_WAIT * 2 ** (attempt - 1)
        assert tasks.retry_notice(channel, message, about, attempt) is False
    assert attempt == notifications.RETRIES
    assert "gave up on the webhook about a test after 6 attempts" in caplog.text


def test_the_message_shows_the_digest_and_its_link_says_if_the_plan_changed_since(
        globex, on_call, approver_user, emails, sample_servers, settings, monkeypatch):
    plan = ready_plan(globex, on_call, monkeypatch)
    assert tasks.notify_plan_ready(plan.pk, plan.check_round) == 1
    [message] = mail.outbox
    short = " ".join([plan.digest[:4], plan.digest[4:8], plan.digest[8:12]])
    assert f"Digest: {short} (whole: {plan.digest})" in message.body
    link = re.search(r"http\S+", message.body.split("Review and sign: ")[1])[0]
    assert link.endswith(f"/plans/{plan.public_id}/?digest={plan.digest[:12]}")
    path = link.split("localhost:8000")[1]
    enrolled(approver_user)
    web = Client()
    web.force_login(approver_user)
    page = web.get(path).content.decode()
    assert "changed since the message was sent" not in page
    assert f'<code title="{plan.digest}">{short}</code>' in page  # by the sign button
    # A colleague edits the deal and the plan is checked again: the link now says so, and what changed.
    sample_servers.colleague_update("D-881", {"amount": 1}, by="priya")
    assert services.queue_checks(plan=plan, ring=False)
    plan = Plan.objects.get(pk=plan.pk)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    page = web.get(path).content.decode()
    banner = page[page.index('id="since-message"'):page.index("</section>", page.index('id="since-message"'))]
    assert "This plan changed since the message was sent" in banner and short in banner
    assert "its check went from “would work now” to “changed since”" in banner
    # A link that carries no digest, or something that is not one, opens the plan as it is.
    for junk in ("", "?digest=zz", "?digest=" + "a" * 80, "?digest[]=1"):
        response = web.get(f"/plans/{plan.public_id}/{junk}")
        assert response.status_code == 200 and "since-message" not in response.content.decode()
