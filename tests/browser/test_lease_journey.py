"""Two plans touch deal D-881 and a real worker runs them, watched in Chromium: the second plan undoes what
it can, then waits for the first plan's lease on the deal, saying who holds it; once Bo signs the first plan
with his passkey and it has run, the deal is handed on, checked again and left alone, and on-call plans the
rest."""


import pytest

from approver.models import Plan, RecordLease
from tests.approver.services.test_approvals import ORIGIN, approve, enrolled
from tests.approver.services.test_leases import two_plans  # noqa: F401 - a fixture
from tests.services import needs_chromium, running_worker, worker_env_for_test_database

from .test_sign_off_journey import authenticated_page, enrol

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def test_the_second_plan_waits_for_the_first_plans_lease(
        two_plans, sample_servers, approver_user, second_approver, chromium, settings, recorder  # noqa: F811
):
    holder, waiter = two_plans
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [ORIGIN]
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    approve(holder, approver_user, ana, choices={})  # the holder's first approval: it holds the deal
    for user, key in ((approver_user, ana), (second_approver, bo)):
        approve(waiter, user, key)  # the quorum rings the worker for the waiter
    settings.WEBAUTHN_ORIGINS = [base]  # Bo signs in the browser, on this site
    # The worker checks every signature again: the ones made above and Bo's in the browser.
    env = {**worker_env_for_test_database(), "WEBAUTHN_ORIGINS": f"{ORIGIN},{base}"}

    with chromium() as browser, running_worker(env, "lease-journey"):
        olivia = authenticated_page(browser, base, "olivia")
        olivia.goto(f"{base}/plans/{waiter.public_id}/")
        # The wait shows from the first approval; the worker undoes what it can before it gets there.
        olivia.locator("#report h2", has_text="1 of 2 actions done, waiting for plan").wait_for(
            timeout=60_000)
        heading = olivia.locator("#report h2").inner_text()
        waits = olivia.locator("#lease-wait-3").inner_text()
        assert [e["op"] for e in sample_servers.ledger("crm") if e["op"] == "compensate"] == []

        bo_page = authenticated_page(browser, base, "bo")
        enrol(bo_page, base, "Bo's phone")
        bo_page.goto(f"{base}/plans/{holder.public_id}/")
        held = bo_page.locator("#lease-held-1").inner_text()
        bo_page.click("#sign-off button[value=approve]")
        bo_page.locator("text=The quorum is reached").wait_for(timeout=15_000)

        # The holder runs and lets the deal go; the waiter, handed it, checks it again: it changed.
        olivia.locator("#report h2", has_text="Partially completed").wait_for(timeout=90_000)
        deal = olivia.locator("#item-3").inner_text()
        olivia.click("#plan-the-rest")
        olivia.locator("#rest-of").wait_for(timeout=15_000)
        olivia.locator(".progress", has_text="Ready for sign-off").wait_for(timeout=60_000)
        rest_url = olivia.url

    short = str(holder.public_id)[:8]
    assert f"Undoing now: 1 of 2 actions done, waiting for plan {short} to let deal D-881 go" in heading
    assert waits.startswith(f"Waits for plan {short}, which holds deal D-881: asked for by olivia, held "
                            "since ")
    assert "if it is not executing then" in waits and "checked again with the server first" in waits
    assert held.startswith("This plan holds the lease on deal D-881 since ")
    assert f"Waiting for it: plan {str(waiter.public_id)[:8]} (asked for by olivia)" in held
    assert "Left alone: changed since" in deal
    assert "Checked again after waiting for another plan's lease" in deal
    holder.refresh_from_db()
    waiter.refresh_from_db()
    assert holder.state == "completed" and waiter.state == "partially_completed"
    assert len([e for e in sample_servers.ledger("crm") if e["op"] == "compensate"]) == 1  # the holder's only
    assert not RecordLease.objects.open().exists()
    rest = Plan.objects.get(rest_of=waiter)
    assert rest_url.endswith(f"/plans/{rest.public_id}/") and rest.state == "ready"
