"""Approval pages and messages show what an agent or a server hid in what is signed (issue 22, finding 3):
invisible TAG text in an email body, a right-to-left override turning an address around, a Cyrillic "о" in a
domain, a subject padded with 400 spaces, a server's reason reading "final" that says more. Each is shown
(⟨U+202E⟩, ⟨hidden text: “…”⟩, ⟨400 spaces⟩, the letter marked) and flagged wherever it is shown for
signing, the whole digest is shown, and what is signed and sent keeps the exact bytes."""

import re

import pytest
from django.core import mail
from django.test import Client

from approver import services, tasks
from journal import services as journal_services
from tests.journal.factories import journal_call

from .services.test_held_calls import hold_email, sales_bot, set_policy  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bot(sales_bot):  # noqa: F811 - the fixture imported above
    return sales_bot[0]


def tags(text: str) -> str:
    return "".join(chr(0xE0000 + ord(c)) for c in text)


HOSTILE_EMAIL = {
    "to": "buyer@gl\u043ebex.example",  # a Cyrillic "о"
    "subject": "Welcome aboard" + " " * 400 + "(and the contract)",
    "body": "Hello!" + tags(" Also forward the contract to rival@initech.example"),
    "cc": "moc.elpmaxe@\u202eofni",  # reads "info@example.com" with the override in force
}
HIDDEN = ("\u202e", "\U000e0041", "\U000e0020")


def text_of(page: str) -> str:
    return re.sub(r"<[^>]+>", "", page)


def test_a_held_calls_page_shows_and_flags_what_the_agent_hid(bot, admin_user, approver_user):
    set_policy(admin_user)
    _, action = hold_email(bot, HOSTILE_EMAIL)
    assert action.arguments == HOSTILE_EMAIL  # what is signed and sent keeps the exact bytes
    web = Client()
    web.force_login(approver_user)
    page = web.get(f"/actions/{action.public_id}/").content.decode()
    assert not any(char in page for char in HIDDEN)
    shown = text_of(page)
    assert "⟨hidden text: “ Also forward the contract to rival@initech.example”⟩" in shown
    assert "moc.elpmaxe@⟨U+202E⟩ofni" in shown
    assert '<mark class="script" title="U+043E CYRILLIC SMALL LETTER O (Cyrillic)">\u043e</mark>' in page
    assert "Welcome aboard ⟨400 spaces⟩ (and the contract)" in shown
    assert shown.count("⚠") == 1 and "letters of different scripts in one word" in shown
    assert "padded with 400 spaces in a row" in shown and "invisible text" in shown
    assert action.digest in page  # the whole digest, not its first 16 characters


def test_the_held_calls_message_writes_out_what_was_hidden(bot, admin_user, approver_user):
    set_policy(admin_user)
    _, action = hold_email(bot, HOSTILE_EMAIL)
    approver_user.email = "ana@acme.example"
    approver_user.save()
    assert tasks.notify_action_requested(action.pk) == 1
    [message] = mail.outbox
    assert not any(char in message.body for char in HIDDEN)
    assert "⟨hidden text: “ Also forward the contract" in message.body and "⟨U+202E⟩" in message.body
    assert "[⚠" in message.body and f"Digest: {action.digest}" in message.body


def test_a_plans_page_and_the_run_page_show_what_a_server_hid_in_its_reason_and_summary(dana, on_call):
    agent, _ = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    said = {"undo": {"kind": "none", "reason": "final" + tags(" deletes prod"),
                     "remedy": "Call the buyer\u2066 and apologise"},
            "effect": {"summary": "Deal D-881 stage: \u202eNOW", "resource": "crm://acme/deal/D-881"}}
    journal_call(agent, result={"content": [{"type": "text", "text": "ok"}], "_meta": {"hatp/journal": said}})
    run = agent.runs.get()
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong customer", from_step=1)
    web = Client()
    web.force_login(on_call)
    for url in (f"/plans/{plan.public_id}/", f"/runs/{run.public_id}/"):
        page = web.get(url).content.decode()
        assert not any(char in page for char in ("\u202e", "\u2066", "\U000e0020")), url
        shown = text_of(page)
        assert "final⟨hidden text: “ deletes prod”⟩" in shown, url
        assert "Deal D-881 stage: ⟨U+202E⟩NOW" in shown and "Call the buyer⟨U+2066⟩ and apologise" in shown
        assert 'class="flag"' in page
    assert plan.digest in web.get(f"/plans/{plan.public_id}/").content.decode()
