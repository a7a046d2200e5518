"""Lena signs in through the company's identity provider (a real OpenID Connect provider, its own sign-in
and consent pages) as a member of the payments approvers' group, sees only payments' plans, and signs one
with a passkey; Sam, of search's approvers, finds no such plan; taken out of the group at the provider, Lena
loses the role at her next request."""

import re

import pytest
from django.contrib.auth.models import User

from approver import services
from approver.models import ApprovalRules, Plan
from journal import services as journal_services
from journal.models import Agent, Team
from tests.browser.conftest import with_passkey_device
from tests.conftest import free_port
from tests.identity import identity_provider
from tests.services import needs_chromium, needs_oidc_provider

pytestmark = [pytest.mark.browser, needs_chromium, needs_oidc_provider,
              pytest.mark.django_db(transaction=True)]

LENA = {"email": "lena@acme.example", "groups": ["undo-payments-approvers"]}
SAM = {"email": "sam@acme.example", "groups": ["undo-search-approvers"]}


def through_the_provider(browser, site: str, login: str):
    """A fresh browser context with its own passkey device, signed in through the provider's pages."""
    page = with_passkey_device(browser)
    page.goto(f"{site}/login/")
    page.click("#sign-in-provider")
    page.fill("input[name=login]", login)  # the provider's own sign-in page
    page.fill("input[name=password]", "any")
    page.click("button[type=submit]")
    page.click("button[type=submit]")  # its consent page: Continue
    page.wait_for_url(re.compile(rf"^{re.escape(site)}/"))
    return page


def test_a_teams_approver_signs_in_through_the_provider_signs_its_plan_and_loses_the_role_with_the_group(
        globex, on_call, admin_user, recorder, tmp_path, settings, chromium):
    site = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [site]
    Team.objects.filter(name=settings.DEFAULT_TEAM).update(everyone=False)
    payments = Team.objects.create(name="payments")
    payments.members.add(on_call)
    journal_services.move_agent(agent=Agent.objects.get(name="sales-bot"), team=payments)
    services.save_approval_rules(rules=ApprovalRules(team=payments, quorum=1), by=admin_user)
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=2)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    plan_url = f"{site}/plans/{plan.public_id}/"

    with identity_provider(tmp_path, port=free_port(), site=site, settings=settings) as provider:
        provider.people(lena=LENA, sam=SAM)
        with chromium() as browser:
            lena = through_the_provider(browser, site, "lena")
            landed = lena.url  # an approver with a plan waiting lands on it
            listed = lena.locator("main").inner_text()
            lena.goto(f"{site}/passkeys/")
            lena.fill("#enrol input[name=name]", "Lena's laptop")
            lena.click("#enrol button")
            lena.locator("text=Passkey “Lena's laptop” enrolled").wait_for(timeout=15_000)
            lena.goto(plan_url)
            lena.click("#sign-off button[value=approve]")
            lena.locator("text=The quorum is reached").wait_for(timeout=15_000)

            sam = through_the_provider(browser, site, "sam")
            sam.goto(f"{site}/plans/")
            sam_plans = sam.locator("main").inner_text()
            sam_answer = sam.goto(plan_url)
            sam_page = sam.locator("main").inner_text()

            provider.people(lena={**LENA, "groups": []}, sam=SAM)  # an admin takes Lena out, at the provider
            after = lena.goto(plan_url)
            after_text = lena.locator("main").inner_text()
            nav = lena.locator("nav").inner_text()

    assert landed.endswith("/plans/?waiting=me") and "sales-bot" in listed
    plan.refresh_from_db()
    assert plan.state == Plan.State.APPROVED
    assert [a.approver.username for a in plan.approvals.all()] == ["lena"]
    assert "sales-bot" not in sam_plans and sam_answer.status == 404 and "No such plan" in sam_page
    assert after.status == 403 and "none of the roles" in after_text and "Passkeys" not in nav
    assert not User.objects.get(username="lena").groups.exists()
