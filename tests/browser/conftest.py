import contextlib

import pytest

from tests.services import CHROMIUM

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def chromium():
    """Opens Debian's Chromium under Playwright (Playwright's own browser download does not work here).

    Use it after the test's database and network set-up: Playwright's sync API keeps an event loop in the
    thread while it is open, and Django's ORM and anyio.run refuse to run inside one."""
    path = CHROMIUM

    @contextlib.contextmanager
    def open_browser():
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()

    return open_browser


def sign_in(page, username: str) -> None:
    """Answer the login page the browser is on as one of the suite's personas (password
    `<name>-password-1`)."""
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"{username}-password-1")
    page.click("button[type=submit]")


def with_passkey_device(browser):
    """A fresh browser context with its own passkey device (a DevTools virtual authenticator): its page."""
    context = browser.new_context()
    page = context.new_page()
    devtools = context.new_cdp_session(page)
    devtools.send("WebAuthn.enable")
    devtools.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True,
        "hasUserVerification": True, "isUserVerified": True}})
    return page
