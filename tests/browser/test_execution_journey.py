"""After the quorum, a real worker undoes the Globex plan while on-call watches the report in Chromium.

The page is opened while the plan is still approved and waiting for the worker: it must follow the plan
into execution and on to the report without a reload."""

import pytest

from approver import services
from tests.approver.services.test_approvals import approve, enrolled
from tests.services import needs_chromium, running_worker, worker_env_for_test_database

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("choice", ["overwrite", "keep_newer"])
def test_the_worker_undoes_the_plan_and_the_page_reports_it(
    globex, sample_servers, on_call, approver_user, second_approver, chromium, settings, recorder, choice
):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={"3": choice})  # the quorum rings the worker
    base = f"http://localhost:{recorder.port}"

    worker_env = worker_env_for_test_database()
    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/plans/{plan.public_id}/")
        page.fill("input[name=username]", "olivia")
        page.fill("input[name=password]", "olivia-password-1")
        page.click("button[type=submit]")
        page.locator("p.waiting", has_text="Waiting for a worker").wait_for(timeout=5_000)
        with running_worker(worker_env, "execution-journey"):
            report = page.locator("#report h2")
            report.filter(has_text="Reversed").wait_for(
                timeout=60_000
            )  # live: the page polls, nobody reloads
            heading = report.inner_text()
            to_do = page.locator(".to-do").inner_text()
        page.click("text=the journaled call >> nth=0")
        journaled = page.locator("p.compensations").inner_text()
        undo_controls = page.locator("details.undo, #undo-chosen, input[name=steps]").count()
        page.goto(f"{base}/runs/{plan.run.public_id}/")
        undone = page.locator("li.step:has(p.undone)")
        undone_lines = undone.locator("p.undone").all_inner_texts()
        undone_offers = undone.locator("details.undo, input[name=steps]").count()
        left_lines = page.locator("p.left-by").all_inner_texts()

    calendar = [e for e in sample_servers.ledger("calendar") if e["op"] == "compensate"]
    crm = [e for e in sample_servers.ledger("crm") if e["op"] == "compensate"]
    assert [n["to"] for n in calendar[0]["notices"]] == ["dana@acme.example", "buyer@globex.example",
                                                         "cto@globex.example"]
    assert "send a correction email" in to_do  # the email, not undone, with its remedy
    # The undo calls read as part of their plan's report, with nothing to undo an undo with.
    assert f"These are the undo calls of plan {str(plan.public_id)[:8]}" in journaled and undo_controls == 0
    # On the agent's run, each step the plan undid says so, and offers no undo of its own any more.
    short = str(plan.public_id)[:8]
    assert undone_lines and all(
        line.startswith(f"Undone by plan {short} on ") and ", let run by ana and bo." in line
        for line in undone_lines) and undone_offers == 0
    # A step the plan left alone says so, and can still be undone by another plan.
    if choice == "overwrite":
        assert left_lines == []
    else:
        [left] = left_lines
        assert left.startswith(f"Not undone by plan {short} (skipped, ") and left.endswith(
            "): it can still be undone.")
    if choice == "overwrite":
        assert heading == "Completed: Reversed 2 of 2 actions; 1 cannot be undone"
        assert len(crm) == 1
    else:
        assert heading == "Partially completed: Reversed 1 of 2 actions; 1 skipped; 1 cannot be undone"
        assert crm == []  # the colleague's change stands
