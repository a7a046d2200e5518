"""Two approvers sign the Globex plan with passkeys in Chromium (DevTools virtual authenticators): the
first overwrites a colleague's newer change with a reason, the second reads that override and signs it, a
real worker runs the plan and the report lists the override; the requester is refused; a plan checked again
after signing must be signed again."""

import re

import anyio
import pytest
from django.contrib.auth.models import Group

from approver import services
from approver.models import Approval, Plan
from journal import services as journal_services
from journal.auth import roles
from journal.models import Run
from samples import agent as scripted
from tests.approver.services.test_approvals import WHY, enrolled
from tests.browser.conftest import sign_in, with_passkey_device
from tests.journal.helpers import register_samples, settle
from tests.services import needs_chromium, running_worker, worker_env_for_test_database

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def authenticated_page(browser, base, username):
    """A fresh browser context with its own passkey device, logged in as `username`."""
    page = with_passkey_device(browser)
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"{username}-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/(runs/|plans/\?waiting=me)$"))  # an approver lands on what waits
    return page


def enrol(page, base, name):
    page.goto(f"{base}/passkeys/")
    page.fill("#enrol input[name=name]", name)
    page.click("#enrol button")
    page.locator(f"text=Passkey “{name}” enrolled").wait_for(timeout=15_000)


def test_two_approvers_sign_with_passkeys_and_the_requester_cannot(
        recorder, sample_servers, dana, on_call, approver_user, second_approver, chromium, settings):
    register_samples(sample_servers)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))
    settle(recorder)
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    run = Run.objects.get()
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    on_call.groups.add(
        Group.objects.get_or_create(name=roles.APPROVER)[0]
    )  # the requester is an approver too
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]
    plan_url = f"{base}/plans/{plan.public_id}/"

    with chromium() as browser:
        ana = authenticated_page(browser, base, "ana")
        enrol(ana, base, "Ana's laptop")
        ana.goto(plan_url)
        assert "0 of 2 approvals that count" in ana.locator("#signatures").inner_text()
        conflict = ana.locator("#changed-since li.item")
        assert "Since then priya changed it" in conflict.inner_text()
        # Field by field: the agent's stage change and priya's amount change since, each cell marked.
        assert conflict.locator("td[data-changed=agent]").inner_text().startswith("Won")
        assert conflict.locator("td[data-changed=since]").inner_text().startswith("45000")
        conflict.locator("input[value=overwrite]").check()
        ana.click("#sign-off button[value=approve]")  # an override needs a reason: nothing is signed yet
        problem = ana.locator("#sign-problem")
        problem.wait_for(timeout=15_000)
        assert "Overwriting a newer change is an override: say why" in problem.inner_text()
        conflict.locator("textarea[name=override-3]").fill(WHY)
        ana.click("#sign-off button[value=approve]")
        ana.locator("text=It needs more approvals before it may run").wait_for(timeout=15_000)
        assert "1 of 2 approvals that count" in ana.locator(".quorum").inner_text()

        olivia = authenticated_page(browser, base, "olivia")
        enrol(olivia, base, "Olivia's phone")
        olivia.goto(plan_url)
        assert "You asked for this plan, so someone else must approve it" in olivia.content()
        assert olivia.locator("#sign-off").count() == 0

        bo = authenticated_page(browser, base, "bo")
        enrol(bo, base, "Bo's laptop")
        bo.goto(plan_url)
        # Ana's override is there for Bo to read, by name and with her reason, and to sign as it is.
        asked_at = bo.locator("#override-3 time").inner_text()
        assert bo.locator("#override-3").inner_text() == (
            f"Override: ana asked to overwrite priya's newer change, {asked_at}: “{WHY}”")
        assert "item 3 by ana" in bo.locator(".overrides-to-sign").inner_text()
        assert bo.locator("#changed-since input[value=overwrite]").is_checked()
        bo.click("#sign-off button[value=approve]")
        bo.locator("text=The quorum is reached").wait_for(timeout=15_000)
        assert "approved, it may run" in bo.locator(".quorum").inner_text()
        # The worker checks every signature again before it starts, for this site's origin.
        with running_worker({**worker_env_for_test_database(), "WEBAUTHN_ORIGINS": base}, "override-journey"):
            bo.locator("#report h2", has_text="Completed").wait_for(timeout=60_000)
        overrides = bo.locator("#report ul.overrides").inner_text()

    plan.refresh_from_db()
    assert plan.state == "completed"
    assert sorted(a.approver.username for a in Approval.objects.all()) == ["ana", "bo"]
    assert overrides.startswith(f"Step 2, deal D-881: ana asked to overwrite priya's newer change: “{WHY}”")
    assert "signed by ana and bo · Undone" in overrides
    [override] = run.entries.filter(event="override")
    assert (override.data["by"], override.data["reason"]) == ("ana", WHY)


def test_a_plan_checked_again_after_signing_shows_what_changed_and_needs_signing_again(
        recorder, sample_servers, dana, on_call, approver_user, chromium, settings):
    register_samples(sample_servers)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))
    settle(recorder)
    plan = services.request_plan(run=Run.objects.get(), requested_by=on_call, reason="r", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]

    with chromium() as browser:
        ana = authenticated_page(browser, base, "ana")
        enrol(ana, base, "Ana's laptop")
        ana.goto(f"{base}/plans/{plan.public_id}/")
        ana.click("#sign-off button[value=approve]")
        ana.locator("text=It needs more approvals").wait_for(timeout=15_000)
    # Meanwhile a colleague edits the deal and someone checks the plan again.
    sample_servers.colleague_update("D-881", {"amount": 1}, by="priya")
    assert services.queue_checks(plan=plan, ring=False)
    services.run_checks(plan=Plan.objects.get(pk=plan.pk), check_round=plan.check_round)

    with chromium() as browser:
        ana = authenticated_page(browser, base, "ana")
        ana.goto(f"{base}/plans/{plan.public_id}/")
        signed = ana.locator(".approvals li").first.inner_text()
        assert "changed since ana signed" in signed
        assert "its check went from “would work now” to “changed since”" in signed
        assert "0 of 2 approvals that count" in ana.locator(".quorum").inner_text()
        assert ana.locator("#sign-off button[value=approve]").is_visible()


def test_without_javascript_the_sign_off_buttons_are_disabled_and_say_why(
        recorder, globex, on_call, approver_user, chromium):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    enrolled(approver_user)
    base = f"http://localhost:{recorder.port}"

    with chromium() as browser:
        page = browser.new_context(java_script_enabled=False).new_page()
        page.goto(f"{base}/plans/{plan.public_id}/")
        sign_in(page, "ana")
        page.wait_for_url(f"{base}/plans/{plan.public_id}/")
        form = page.locator("#sign-off")
        assert form.get_attribute("method") == "post"
        assert form.locator("button[value=approve]").is_disabled()
        assert form.locator("button[value=reject]").is_disabled()
        assert "Signing needs JavaScript" in page.content()
        form.locator("button[value=approve]").click(force=True)  # forced: a disabled button sends nothing
        assert page.url == f"{base}/plans/{plan.public_id}/"
    assert not Approval.objects.exists()
