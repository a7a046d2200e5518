"""A failed call stopped sales-bot's run (a saga policy): on-call finds the run halted in Chromium, follows
the
plan that undoes it, and releases the run so the agent's calls go through again."""

import pytest

from approver.models import Plan
from journal.models import Run
from tests.approver.services.test_sagas import MISSING, calls, saga_policy
from tests.browser.conftest import sign_in
from tests.journal.helpers import register_samples
from tests.services import needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_on_call_releases_a_halted_run(
    recorder, sample_servers, dana, on_call, admin_user, chromium, monkeypatch
):
    from approver import tasks
    from journal import services

    for task in (tasks.check_plan, tasks.draft_plan):
        monkeypatch.setattr(task, "delay", lambda *args: None)
    register_samples(sample_servers, names=("crm",))
    token = services.create_agent(name="sales-bot", on_behalf_of=dana)[1]
    saga_policy(admin_user, "propose")
    calls(recorder, token, [("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}), MISSING])
    run, plan = Run.objects.get(), Plan.objects.get()
    base = f"http://localhost:{recorder.port}"

    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/runs/{run.public_id}/")
        sign_in(page, "olivia")
        page.wait_for_url(f"{base}/runs/{run.public_id}/")
        banner = page.locator("#halted").inner_text()
        assert "Halted." in banner and "Step 2 (crm__update_deal) failed" in banner
        assert f"/plans/{plan.public_id}/" in banner
        assert page.get_attribute("#halted a", "href") == f"/plans/{plan.public_id}/"
        page.click("#halted button[type=submit]")
        page.wait_for_url(f"{base}/runs/{run.public_id}/")
        assert "Run released" in page.locator("p.message").first.inner_text()
        assert page.locator("#halted").count() == 0

    run.refresh_from_db()
    assert run.halted_by_plan == "" and run.entries.get(event="released").data["by"] == "olivia"
    assert not calls(recorder, token, [("crm__get_deal", {"deal_id": "D-881"})])[0].get("isError")
