"""After the quorum, a real worker undoes the Globex plan while on-call watches the report in Chromium."""

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from approver import services
from tests.approver.test_approvals import approve, enrolled
from tests.services import needs_chromium, running_worker, worker_env_for_test_database


def ring_again(plan) -> None:
    """From a thread of its own: Playwright's sync API keeps an event loop in this one, and Celery's
    producer (like the ORM) will not run inside it."""
    import threading

    from approver import tasks

    thread = threading.Thread(target=tasks.execute_plan.delay, args=(plan.pk,))
    thread.start()
    thread.join(timeout=10)


pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("choice", ["overwrite", "keep_newer"])
def test_the_worker_undoes_the_plan_and_the_page_reports_it(
        globex, sample_servers, on_call, approver_user, second_approver, chromium, settings, recorder, choice):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={"3": choice})  # the quorum rings the worker
    base = f"http://localhost:{recorder.port}"

    with running_worker(worker_env_for_test_database(), "execution-journey"), chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/plans/{plan.public_id}/")
        page.fill("input[name=username]", "olivia")
        page.fill("input[name=password]", "olivia-password-1")
        page.click("button[type=submit]")
        report = page.locator("#report h2")
        for _ in range(6):  # live: no reload
            try:
                report.filter(has_text="Reversed").wait_for(timeout=10_000)
                break
            except PlaywrightTimeout:
                ring_again(plan)  # as the periodic reconciler would, had the first bell been lost
        report.filter(has_text="Reversed").wait_for(timeout=1_000)
        heading = report.inner_text()
        to_do = page.locator(".to-do").inner_text()

    calendar = [e for e in sample_servers.ledger("calendar") if e["op"] == "compensate"]
    crm = [e for e in sample_servers.ledger("crm") if e["op"] == "compensate"]
    assert [n["to"] for n in calendar[0]["notices"]] == ["dana@acme.example", "buyer@globex.example",
                                                         "cto@globex.example"]
    assert "send a correction email" in to_do  # the email, not undone, with its remedy
    if choice == "overwrite":
        assert heading == "Completed: Reversed 2 of 3 actions; 1 cannot be undone"
        assert len(crm) == 1
    else:
        assert heading == "Partially completed: Reversed 1 of 3 actions; 1 cannot be undone; 1 skipped"
        assert crm == []  # the colleague's change stands
