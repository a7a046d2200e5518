"""An incident tool with Olivia's personal API token asks for the Globex undo over HTTP, waits while a real
worker drafts and checks it, reads that it needs two approvals and from whom, and, once Ana and Bo have
signed with passkeys in Chromium, reads what each item did; the sample servers' ledgers say the same. A
revoked, an expired, an unknown and a read-only token are refused."""

import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from approver import services
from approver.models import PersonalToken, PlanItem
from tests.browser.test_sign_off_journey import authenticated_page, enrol
from tests.services import needs_chromium, running_worker, worker_env_for_test_database

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]


def until(read, done, *, timeout=90.0):
    """Read again every half second until `done(answer)`; the last answer."""
    deadline = time.monotonic() + timeout
    answer = read()
    while not done(answer):
        assert time.monotonic() < deadline, f"still {answer.get('state')!r} after {timeout} s"
        time.sleep(0.5)
        answer = read()
    return answer


def test_a_token_asks_for_a_plan_reads_its_checks_and_approvals_and_after_two_signatures_its_report(
        globex, sample_servers, on_call, approver_user, second_approver, chromium, settings, recorder):
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]
    _, token = services.make_token(user=on_call, name="incident tool", days=7, scope="undo")
    _, reader = services.make_token(user=on_call, name="dashboard", days=7)
    old, revoked = services.make_token(user=on_call, name="old script", days=7, scope="undo")
    services.revoke_token(token=old)
    lapsed, expired = services.make_token(user=on_call, name="last month's", days=7, scope="undo")
    PersonalToken.objects.filter(pk=lapsed.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    ask = f"/runs/{globex.public_id}/plans/"
    body = {"fromStep": 2, "reason": "sales-bot marked the wrong deal Won"}

    def with_token(value):
        return httpx.Client(base_url=f"{base}/api", headers={"Authorization": f"Bearer {value}"}, timeout=30)

    for refused in (revoked, expired, "uat_" + "x" * 43):
        answer = with_token(refused).post(ask, json=body)
        assert answer.status_code == 401 and answer.json() == {
            "error": "This API token is unknown, revoked or expired."}
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    read_only = with_token(reader).post(ask, json=body)
    assert read_only.status_code == 403 and "may only read" in read_only.json()["error"]
    assert with_token(reader).get(f"/runs/{globex.public_id}/").json()["team"] == "everyone"

    api = with_token(token)
    with running_worker({**worker_env_for_test_database(), "WEBAUTHN_ORIGINS": base}, "api-journey"):
        asked = api.post(ask, json=body)
        assert asked.status_code == 201, asked.text
        plan_id = asked.json()["id"]
        assert asked.json()["state"] == "drafting" and asked.json()["report"] is None
        ready = until(lambda: api.get(f"/plans/{plan_id}/").json(), lambda p: p["state"] == "ready")
        again = api.post(ask, json=body)  # the same steps are in an open plan: said, with which
        assert again.status_code == 409 and again.json()["openPlan"] == plan_id

        with chromium() as browser:
            for name, device in (("ana", "Ana's laptop"), ("bo", "Bo's phone")):
                page = authenticated_page(browser, base, name)
                enrol(page, base, device)
                page.goto(f"{base}/plans/{plan_id}/")
                page.click("#sign-off button[value=approve]")
                page.locator("text=You approved the plan").wait_for(timeout=15_000)
                if name == "ana":
                    with_ana = api.get(f"/plans/{plan_id}/").json()["approvals"]
        finished = until(lambda: api.get(f"/plans/{plan_id}/").json(),
                         lambda p: (p["report"] or {}).get("finished"))

    # Ready: checked, and it says it needs two approvals, of the two who may give them.
    assert ready["checks"]["done"] == ready["checks"]["total"] == 2 and ready["report"] is None
    assert {c["status"] for c in ready["checks"]["items"]} == {"ok"}
    assert ready["approvals"] | {"signed": []} == {"quorum": 2, "counted": 0, "stillNeeded": 2,
                                                  "mayStillSign": ["ana", "bo"], "signed": []}
    assert ready["summary"].startswith("Undo 2 actions by sales-bot for dana")
    assert ready["team"] == "everyone" and ready["digest"] and ready["sentence"]
    assert (with_ana["counted"], with_ana["stillNeeded"], with_ana["mayStillSign"]) == (1, 1, ["bo"])
    assert [(s["by"], s["counts"]) for s in finished["approvals"]["signed"]] == [("ana", True), ("bo", True)]
    # The report, item by item, is what the database and the tool servers' ledgers say happened.
    report = finished["report"]
    items = {i.position: i for i in PlanItem.objects.filter(plan__public_id=plan_id).select_related("step")}
    assert [(r["item"], r["step"], r["outcome"], r["state"]) for r in report["items"]] == [
        (p, i.step.number, i.outcome or None, i.exec_state) for p, i in sorted(items.items())]
    undone = {r["tool"]: r for r in report["items"] if r["outcome"] == "compensated"}
    assert set(undone) == {"update_deal", "create_event"}
    assert all(r["outcomeWords"] == "Undone" and r["attempts"] >= 1 and r["finishedAt"]
               for r in undone.values())
    emailed = next(r for r in report["items"] if r["tool"] == "send_email")
    assert emailed["outcome"] == "irreversible" and emailed["needsAPerson"]
    assert [e["op"] for e in sample_servers.ledger("crm") if e["op"] == "compensate"] == ["compensate"]
    assert [e["op"] for e in sample_servers.ledger("calendar") if e["op"] == "compensate"] == ["compensate"]
    assert report["summary"] == "Reversed 2 of 2 actions; 1 cannot be undone"
    assert finished["state"] == "completed"
