"""An approver enrols a passkey in Chromium with a virtual authenticator, then revokes it."""

import pytest

from approver.models import Passkey
from tests.browser.conftest import sign_in
from tests.services import needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_an_approver_enrols_and_revokes_a_passkey(recorder, approver_user, chromium, settings):
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]

    with chromium() as browser:
        page = browser.new_page()
        # The DevTools WebAuthn domain: a platform authenticator that verifies the user.
        devtools = page.context.new_cdp_session(page)
        devtools.send("WebAuthn.enable")
        devtools.send("WebAuthn.addVirtualAuthenticator", {"options": {
            "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
            "hasUserVerification": True, "isUserVerified": True}})

        page.goto(f"{base}/passkeys/")
        page.fill("input[name=username]", "ana")
        page.fill("input[name=password]", "ana-password-1")
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/passkeys/")
        assert "No passkey yet" in page.content()

        page.fill("#enrol input[name=name]", "Work laptop")
        page.click("#enrol button")
        page.locator("text=Passkey “Work laptop” enrolled").wait_for(timeout=15_000)
        row = page.locator("table.runs tbody tr").first
        assert "Work laptop" in row.inner_text()

        # Enrolling the same authenticator again is refused by the browser itself (it is excluded).
        page.fill("#enrol input[name=name]", "Again")
        page.click("#enrol button")
        page.locator("#enrol-problem").wait_for(state="visible", timeout=15_000)

        row.locator("summary", has_text="Revoke…").click()  # asked to confirm, with what revoking does
        assert "Approvals signed with it stop counting" in row.inner_text()
        row.locator("button", has_text="Revoke this passkey").click()
        page.locator("text=revoked").first.wait_for()

    passkey = Passkey.objects.get()
    assert passkey.user == approver_user and passkey.name == "Work laptop" and passkey.revoked_at is not None


def test_without_javascript_the_passkey_buttons_are_disabled_and_send_nothing(
        recorder, approver_user, chromium):
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        context = browser.new_context(java_script_enabled=False)
        page = context.new_page()
        page.goto(f"{base}/passkeys/")
        sign_in(page, "ana")
        page.wait_for_url(f"{base}/passkeys/")
        form = page.locator("#enrol")
        assert form.get_attribute("method") == "post"  # never a GET with the CSRF token in its query
        assert form.locator("button").is_disabled()
        assert "Enrolling a passkey needs JavaScript" in page.content()
        page.fill("#enrol input[name=name]", "No script")
        page.press("#enrol input[name=name]", "Enter")  # implicit submission: a form whose button is off
        assert page.url == f"{base}/passkeys/" and "csrfmiddlewaretoken" not in page.url
    assert not Passkey.objects.exists()
