"""An undo through an app's screens, seen by on-call in Chromium: the plan says the desk takes the change back
through its own screens, shows what the fingerprint covers, and that a person must sign it."""

import re

import pytest

from approver.models import Plan
from journal import services
from journal.models import Run
from tests.browser.conftest import sign_in
from tests.journal.helpers import register_samples, run_agent
from tests.services import needs_chromium, running_worker, worker_env_for_test_database

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_on_call_undoes_a_change_made_through_the_desks_screens(
    recorder, sample_servers, dana, on_call, chromium
):
    register_samples(sample_servers, names=("desk",))
    _, token = services.create_agent(name="desk-bot", on_behalf_of=dana)

    async def script(client):
        return await client.call_tool("desk__trash_record", {"id": "C-78"})

    assert not run_agent(recorder, token, script).is_error
    run = Run.objects.get()
    base = f"http://localhost:{recorder.port}"

    with running_worker(worker_env_for_test_database(), "ui-undo"), chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/runs/{run.public_id}/")
        sign_in(page, "olivia")
        page.wait_for_url(f"{base}/runs/{run.public_id}/")
        assert "Reversible through the app's screens" in page.locator("#step-1 .badge").inner_text()
        page.locator("#step-1 details.undo summary").click()
        page.locator("#step-1 input[name=reason]").fill("the agent trashed a live customer")
        page.locator("#step-1 button", has_text="Undo from step 1").click()
        page.wait_for_url(re.compile(r".*/plans/[0-9a-f-]+/$"))
        page.locator("text=Ready for sign-off").wait_for(timeout=60_000)
        item = page.locator("#will-be-undone li.item")
        assert item.count() == 1
        text = item.inner_text()
        assert "undone through the app's screens" in text and "Trash › C-78" in text
        assert "title “Initech”, status “Customer”, owner “dana”" in text
        assert "a person signs it, whatever the policies say" in text
        assert "Would work now" in text and "Restore" in text

    plan = Plan.objects.get()
    assert plan.state == "ready" and plan.items.get().via == "ui" and not plan.approved_by_policy
