"""An on-call engineer logs in and reads the Globex run, in Chromium."""

import re

import pytest

from journal import services
from journal.models import Run
from samples import agent as scripted
from tests.journal.helpers import register_samples, settle
from tests.services import needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_on_call_opens_the_globex_run_and_reads_its_badges(recorder, sample_servers, dana, on_call, chromium):
    import anyio

    register_samples(sample_servers)
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))
    settle(recorder)
    run = Run.objects.get()
    base = f"http://localhost:{recorder.port}"

    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/")
        assert "/login/" in page.url
        page.fill("input[name=username]", "olivia")
        page.fill("input[name=password]", "olivia-password-1")
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/runs/$"))
        row = page.locator("table.runs tbody tr").first
        assert "sales-bot" in row.inner_text() and "dana" in row.inner_text()

        row.locator("a").click()
        page.wait_for_url(f"{base}/runs/{run.public_id}/")
        steps = page.locator("li.step")
        assert steps.count() == 4
        deal, meeting, email = steps.nth(1), steps.nth(2), steps.nth(3)
        assert deal.locator(".badge").inner_text() == "Reversible via the API"
        assert "Deal D-881 stage: Proposal → Won" in deal.inner_text()
        assert re.search(r"Undo possible for 6\s+days", deal.inner_text())
        assert meeting.locator(".badge").inner_text() == "Reversible via the API"
        assert "attendees get a cancellation notice" in meeting.inner_text()
        assert email.locator(".badge").inner_text() == "Cannot be undone"
        assert "send a correction email" in email.inner_text()
        assert steps.nth(0).locator(".badge").inner_text() == "Read-only"

        # The exact undo call is one click away.
        deal.locator("details.call summary").click()
        assert "hatp_compensate" in deal.locator("details.call").inner_text()

        page.click("text=Log out")
        page.wait_for_url(re.compile(r".*/login/$"))
