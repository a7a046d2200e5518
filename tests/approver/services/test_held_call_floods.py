"""Issue 43, finding 7: held-call floods, through the real Recorder. One agent may have only so many calls
waiting on approvers (one more is refused, not held); approvers hear of new held calls at most once in a
while, in one message; a call to a tool its server does not list, or from an agent that may not ask
approvers, is refused and nobody is asked."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from approver import tasks
from approver.models import ActionRequest
from journal.models import Agent, Step

from .test_held_calls import EMAIL, call, decide, sales_bot, sent_emails, set_policy

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["sales_bot"]  # a fixture, used by name


def email_to(n: int) -> dict:
    return {**EMAIL, "subject": f"Offer {n}"}


def test_an_agent_may_have_only_so_many_calls_waiting_and_one_more_is_refused_not_held(
        recorder, sales_bot, sample_servers, admin_user, approver_user, settings):
    settings.HELD_CALLS_PER_AGENT, settings.RECORDER_HOLD_WAIT_SECONDS = 3, 0.2
    _, token = sales_bot
    set_policy(admin_user)
    told = [call(recorder, token, "mail__send_email", email_to(n)) for n in range(5)]
    assert all(result.is_error for result in told)
    assert all("awaits approval" in result.content[0].text for result in told[:3])
    for result in told[3:]:
        text = result.content[0].text
        assert "already has 3 calls waiting for approval" in text and "nothing was sent" in text, text
        assert result.meta["hatp/journal"]["recovery"]["action"] == "backoff"
    assert ActionRequest.objects.count() == 3 and sent_emails(sample_servers) == []
    # A call it already waits on is not "one more": once approved, it goes through.
    decide(ActionRequest.objects.order_by("created_at").first(), approver_user, "approve")
    assert not call(recorder, token, "mail__send_email", email_to(0)).is_error
    assert [e["subject"] for e in sent_emails(sample_servers)] == ["Offer 0"]


def test_approvers_hear_of_held_calls_in_one_message_at_most_once_in_a_while(
        recorder, sales_bot, sample_servers, admin_user, approver_user, second_approver, settings):
    settings.RECORDER_HOLD_WAIT_SECONDS = 0.2
    for user in (approver_user, second_approver):
        user.email = f"{user.username}@acme.example"
        user.save()
    _, token = sales_bot
    set_policy(admin_user)
    for n in range(4):
        call(recorder, token, "mail__send_email", email_to(n))
    first = ActionRequest.objects.order_by("created_at").first()
    assert tasks.notify_action_requested(first.pk) == 1
    [message] = mail.outbox
    assert message.subject == "4 calls held for approval"
    assert sorted(message.to) == sorted([approver_user.email, second_approver.email])
    assert message.body.count("Approve or deny: ") == 4
    call(recorder, token, "mail__send_email", email_to(9))
    latest = ActionRequest.objects.order_by("created_at").last()
    assert tasks.notify_action_requested(latest.pk) == 0 and len(mail.outbox) == 1  # within the window
    window = timedelta(minutes=settings.HELD_CALL_NOTIFY_MINUTES)
    ActionRequest.objects.update(notified_at=timezone.now() - window)
    assert tasks.notify_action_requested(latest.pk) == 1
    assert mail.outbox[1].subject == "Held for approval: sales-bot wants send_email"


def test_a_call_to_a_tool_its_server_does_not_list_is_refused_and_nobody_is_asked(
        recorder, sales_bot, sample_servers, admin_user):
    _, token = sales_bot
    set_policy(admin_user, unknown="ask")
    result = call(recorder, token, "mail__wire_money", {"to": "mallory"})
    text = result.content[0].text
    assert result.is_error and "mail does not list a tool named wire_money" in text, text
    assert ActionRequest.objects.count() == 0
    step = Step.objects.get(tool="wire_money")
    assert step.failure_class == "policy" and step.policy_decision["decision"] == "deny"


def test_an_agent_that_may_not_ask_approvers_has_its_held_calls_refused(
        recorder, sales_bot, sample_servers, admin_user):
    agent, token = sales_bot
    Agent.objects.filter(pk=agent.pk).update(asks_approvers=False)
    set_policy(admin_user)
    result = call(recorder, token, "mail__send_email", EMAIL)
    text = result.content[0].text
    assert result.is_error and "sales-bot may not ask them" in text and "Nothing was sent to mail" in text
    assert ActionRequest.objects.count() == 0 and sent_emails(sample_servers) == []
