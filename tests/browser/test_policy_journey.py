"""Autonomy policies in Chromium: an admin drafts a policy and reads the simulator before saving it; an
approver signs a call the Recorder is holding, and the waiting agent's email goes out."""

import threading
import time

import anyio
import pytest

from approver import policy, services
from approver.models import ActionRequest, AutonomyPolicy, PolicyChange
from journal import services as journal_services
from samples import agent as scripted
from tests.journal.helpers import register_samples, settle
from tests.services import needs_chromium

from .test_sign_off_journey import authenticated_page, enrol

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_an_admin_drafts_a_policy_reads_the_simulator_and_saves_it(recorder, sample_servers, dana, admin_user,
                                                                  chromium):
    register_samples(sample_servers)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))  # no policy yet
    settle(recorder)
    base = f"http://localhost:{recorder.port}"

    with chromium() as browser:
        ada = authenticated_page(browser, base, "ada")
        ada.click("nav >> text=Policies")
        assert "No policy is set" in ada.content()
        ada.click("text=New policy…")
        ada.fill("input[name=name]", "Careful with email")
        ada.select_option("select[name=scope]", "everything")
        ada.check("input[name=decision_none][value=deny]")  # a change: htmx asks the simulator
        simulation = ada.locator("#simulation")
        simulation.locator("text=Had this draft been in force for the last 4 calls").wait_for(timeout=10_000)
        text = simulation.inner_text()
        assert "1 denied" in text and "mail__send_email" in text
        assert "1 call would be decided differently from today" in text
        ada.click("button[name=save]")
        ada.locator("text=Policy “Careful with email” saved").wait_for(timeout=10_000)
        listed = ada.locator("table.policies").inner_text()
        log = ada.locator("#policy-log").inner_text()

    assert "Careful with email" in listed and "every call" in listed
    assert "intact: 1 entry, 1 signed checkpoint" in log and "ada" in log
    row = AutonomyPolicy.objects.get()
    assert row.decisions["none"] == "deny" and PolicyChange.objects.get().data["by"] == "ada"


def test_an_approver_signs_a_held_call_and_the_waiting_agent_goes_on(
    recorder, sample_servers, dana, admin_user, approver_user, chromium, settings
):
    register_samples(sample_servers)
    services.save_policy(row=AutonomyPolicy(name="Default", scope="everything", ask_timeout=60,
                                            decisions=dict(policy.DEFAULT_DECISIONS)), by=admin_user)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    told = []
    agent = threading.Thread(target=lambda: anyio.run(lambda: scripted.replay(
        f"{recorder.base}/mcp/", token, say=told.append, patient=True, longest_pause=0.5)))
    agent.start()
    deadline = time.monotonic() + 30
    while (action := ActionRequest.objects.filter(tool="send_email").first()) is None:
        assert time.monotonic() < deadline, "the email was not held"
        time.sleep(0.2)
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]

    with chromium() as browser:
        ana = authenticated_page(browser, base, "ana")
        enrol(ana, base, "Ana's laptop")
        ana.click("nav >> text=Held calls")
        ana.click("text=mail__send_email")
        page = ana.locator("main").inner_text()
        assert "sales-bot wants to call mail__send_email" in page
        assert "delivered to external recipients" in page and "buyer@globex.example" in page
        ana.click("#sign-off button[value=approve]")
        ana.locator("text=You approved the call. It goes through once").wait_for(timeout=15_000)
        agent.join(timeout=30)
        assert not agent.is_alive()
        ana.goto(f"{base}/actions/{action.public_id}/")
        state = ana.locator("#held-call h2").inner_text()
        standing = ana.locator("#standing").inner_text()

    assert state == "Approved by ana, and sent"
    assert standing.startswith("Sent by the agent after ana's approval (step ") and standing.endswith(
        "; the server did it.")
    assert told[-1].startswith("  mail__send_email: Emailed 'Welcome aboard, Globex' to buyer@globex.example")
    assert [e["to"] for e in sample_servers.ledger("mail") if e["op"] == "send_email"] == [
        "buyer@globex.example"
    ]
