"""On-call undoes the Globex run from step 1 and watches a real worker check the plan, in Chromium."""

import re

import anyio
import pytest

from approver.models import Plan
from journal import services
from journal.models import Run
from samples import agent as scripted
from tests.browser.conftest import sign_in
from tests.journal.helpers import register_samples, settle
from tests.services import needs_chromium, running_worker, worker_env_for_test_database

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_on_call_undoes_from_step_1_and_reads_the_three_sections(
    recorder, sample_servers, dana, on_call, chromium
):
    register_samples(sample_servers)
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))
    settle(recorder)
    run = Run.objects.get()
    # A colleague raises the deal's amount after the agent marked it Won.
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    base = f"http://localhost:{recorder.port}"

    with running_worker(worker_env_for_test_database(), "plan-journey"), chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/runs/{run.public_id}/")
        page.fill("input[name=username]", "olivia")
        page.fill("input[name=password]", "olivia-password-1")
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/runs/{run.public_id}/")

        first = page.locator("li.step").first
        first.locator("details.undo summary").click()
        first.locator("input[name=reason]").fill("sales-bot closed the wrong deal")
        first.locator("button", has_text="Undo from step 1").click()
        page.wait_for_url(re.compile(r".*/plans/[0-9a-f-]+/$"))
        # The worker drafts the plan (the page says so, then reloads itself once it is drafted).
        page.locator("h1", has_text="Undo 2 actions by sales-bot for Dana").wait_for(timeout=60_000)

        # The worker checks while we watch: htmx swaps the progress in place, no reload.
        page.locator("text=Ready for sign-off").wait_for(timeout=60_000)
        assert "checked 2 of 2" in page.locator(".progress").inner_text()
        assert page.locator("button", has_text="Check again").is_visible()

        undo = page.locator("#will-be-undone li.item")
        assert undo.count() == 2
        assert "Kickoff with Globex" in undo.nth(0).inner_text()
        assert "Would work now" in undo.nth(0).inner_text()
        assert "Deal D-881" in undo.nth(1).inner_text() and "Changed since" in undo.nth(1).inner_text()
        undo.nth(1).locator("summary").click()
        assert "hatp_compensate" in undo.nth(1).locator("details").inner_text()

        cannot = page.locator("#cannot-be-undone li.item")
        assert cannot.count() == 1 and "send_email" in cannot.inner_text()
        assert "send a correction email" in cannot.inner_text()

        changed = page.locator("#changed-since li.item")
        assert "Since then priya changed it" in changed.inner_text() and "v14" not in changed.inner_text()
        changed.locator("details.details summary").click()  # the versions, for those who want them
        versions = changed.inner_text()
        assert "The agent left it at v13" in versions and "it is now at v14" in versions

    plan = Plan.objects.get()
    assert plan.state == "ready" and plan.conflict_count == 1


def test_on_call_ticks_the_steps_to_undo_and_the_plan_says_why_each_extra_step_came_in(
        recorder, globex, on_call, chromium):
    run = globex
    base = f"http://localhost:{recorder.port}"

    with running_worker(worker_env_for_test_database(), "choose-steps"), chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/runs/{run.public_id}/")
        sign_in(page, "olivia")
        page.wait_for_url(f"{base}/runs/{run.public_id}/")
        page.check("#step-2 input[name=steps]")
        page.fill("#undo-chosen input[name=reason]", "the deal was never won")
        page.click("#undo-chosen button[type=submit]")
        page.wait_for_url(re.compile(r".*/plans/[0-9a-f-]+/$"))
        assert "steps 2" in page.locator(".meta").first.inner_text()
        # The worker drafts the plan and checks it; the page fills in by itself.
        page.locator("#will-be-undone li.item .facts").first.wait_for(timeout=60_000)
        facts = page.locator("#will-be-undone li.item .facts").all_inner_texts()
        deal = next(text for text in facts if "Step 2" in text)
        event = next(text for text in facts if "Step 3" in text)
        assert "Step 2 (chosen)" in deal and "Step 3 (added: " in event and "step 2" in event

    plan = Plan.objects.get()
    assert plan.chosen_steps == [2] and sorted(plan.items.values_list("step__number", flat=True)) == [2, 3, 4]
