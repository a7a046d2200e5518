"""Issue 44 in a real browser, on a laptop and at phone size (390×844): what an approver reads is what signing
does. The plan opens with the sentence the executor's own intent computes; an approver who signed sees that
she did; the undo-since form, in Europe/Berlin, undoes the hour the viewer meant. Screenshots of the plan's
top land in VAR_DIR/screenshots (docs/undo.md shows them)."""

import os
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from approver import sentence, services
from approver.models import Plan
from tests.approver.services.test_approvals import approve, enrolled, relying_party  # noqa: F401
from tests.browser.conftest import sign_in
from tests.services import needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
SHOTS = Path(os.environ.get("VAR_DIR", "var")) / "screenshots"


def log_in(browser, base, username, size, **context):
    page = browser.new_context(viewport=size, **context).new_page()
    page.goto(f"{base}/login/")
    sign_in(page, username)
    page.wait_for_load_state()
    return page


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_plan_opens_with_what_signing_does_and_ana_sees_she_signed(
        recorder, globex, sample_servers, on_call, approver_user, second_approver, chromium, size):
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    approve(plan, approver_user, enrolled(approver_user), choices={"3": "overwrite"})
    plan = Plan.objects.get(pk=plan.pk)
    enrolled(second_approver)
    words = sentence.of_items(list(services.items_for_page(plan))).text()
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        page = log_in(browser, base, "bo", size)
        page.goto(f"{base}/plans/{plan.public_id}/")
        top = page.locator("#sentence")
        assert top.inner_text() == words
        assert top.bounding_box()["y"] < size["height"]  # at the top: read before anything else
        assert page.locator("#sign-sentence").inner_text() == words
        assert "Signing will: cancel 'Kickoff with Globex'" in words
        assert "It will not touch: priya's amount change" in words
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"plan-top-{size['width']}.png"))
        ana = log_in(browser, base, "ana", size)
        ana.goto(f"{base}/plans/{plan.public_id}/")
        assert "You approved this plan as it is now" in ana.locator("#signatures").inner_text()
        assert ana.locator("#sign-off button[value=approve]").count() == 0  # no second signature
        assert ana.locator("#sentence").inner_text() == words.replace("Signing will:",
                                                                      "Once approved, this plan will:")


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_undo_since_form_in_berlin_undoes_the_hour_meant(recorder, globex, on_call, chromium, size):
    since = globex.started_at
    berlin = since.astimezone(ZoneInfo("Europe/Berlin"))
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        page = log_in(browser, base, "olivia", size, timezone_id="Europe/Berlin")
        page.goto(f"{base}/runs/{globex.public_id}/")
        assert page.evaluate("document.documentElement.dataset.zone") == "Europe/Berlin"
        page.click("text=undo everything sales-bot did since this run began")
        field = page.locator("input[name=since]")
        assert field.input_value() == f"{berlin:%Y-%m-%dT%H:%M:%S}"
        assert "Since (Europe/Berlin)" in page.locator("form.undo-since").inner_text()
        page.fill("input[name=reason]", "it went wrong then")
        page.click("form.undo-since button[type=submit]")
        page.wait_for_url("**/plans/**")
        title = page.locator("h1").inner_text()
    assert f"since {berlin:%Y-%m-%d %H:%M:%S} {berlin.tzname()}" in title
    assert Plan.objects.get().since == since.replace(microsecond=0)  # the hour meant, not one off


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_bo_without_a_passkey_enrols_from_the_plan_and_comes_back_to_sign(
        recorder, globex, sample_servers, on_call, second_approver, chromium, settings, size):
    """Issue 44, finding 10: bo, from the email, found "first enrol a passkey" at the end of a 4,700 px page,
    and once enrolled had no way back to the plan."""
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    with chromium() as browser:
        page = log_in(browser, base, "bo", size)
        devtools = page.context.new_cdp_session(page)
        devtools.send("WebAuthn.enable")
        devtools.send("WebAuthn.addVirtualAuthenticator", {"options": {
            "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
            "hasUserVerification": True, "isUserVerified": True}})
        page.goto(f"{base}/plans/{plan.public_id}/?digest={plan.digest[:12]}")
        first = page.locator("#enrol-first")
        assert first.bounding_box()["y"] < size["height"]  # told at the top, not at the end
        first.locator("a").click()
        page.fill("#enrol input[name=name]", "Phone")
        page.click("#enrol button")
        page.wait_for_url(f"{base}/plans/{plan.public_id}/")
        assert "You are back where you were, and can sign now" in page.content()
        assert page.locator("#sign-off button[value=approve]").count() == 1
        assert page.locator("#enrol-first").count() == 0
