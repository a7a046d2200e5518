"""An approver enrols a passkey in Chromium with a virtual authenticator, then revokes it."""

import pytest

from approver.models import Passkey
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

        row.locator("button", has_text="Revoke").click()
        page.locator("text=revoked").first.wait_for()

    passkey = Passkey.objects.get()
    assert passkey.user == approver_user and passkey.name == "Work laptop" and passkey.revoked_at is not None
