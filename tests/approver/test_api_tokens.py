"""Personal API tokens and the write API: a token is shown once and kept as a hash, acts with its person's
roles and teams as they are at each call, within its scope; the API checks a request as the pages do, says
what is wrong in JSON, and its OpenAPI document is generated from the code."""

import hashlib
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approver import services
from approver.models import PersonalToken, Plan
from journal import services as journal_services
from journal.auth import roles
from journal.models import Team
from tests.journal.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(dana):
    agent, _ = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    return make_run(agent, steps=3)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_a_token_is_shown_once_kept_as_a_hash_and_revoked_from_its_page(client, on_call, run):
    client.force_login(on_call)
    made = client.post(reverse("approver:token_list"), {"name": "runbook", "days": "30", "scope": "undo"})
    page = made.content.decode()
    row = PersonalToken.objects.get()
    token = page.split('<code class="token" id="token-value">')[1].split("</code>")[0]
    assert token.startswith("uat_") and row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert "shown this once" in page and made.headers["Cache-Control"].startswith("max-age=0")
    assert (row.expires_at - row.created_at) == timedelta(days=30) and row.scope == "undo"
    again = client.get(reverse("approver:token_list")).content.decode()
    assert token not in again and f"{row.prefix}…" in again and token[:10] == row.prefix
    api = Client()
    assert api.get(reverse("api:run_list"), headers=bearer(token)).json()["count"] == 1
    assert api.get(reverse("api:run_list"), headers=bearer(token)).status_code == 200
    client.post(reverse("approver:token_revoke", args=[row.pk]))
    assert api.get(reverse("api:run_list"), headers=bearer(token)).status_code == 401
    assert "revoked" in client.get(reverse("approver:token_list")).content.decode()


@pytest.mark.parametrize(("posted", "problem"), [
    ({"name": "", "days": "30", "scope": "read"}, "Say what the token is for"),
    ({"name": "x", "days": "400", "scope": "read"}, "A token lasts from 1 to 90 days."),
    ({"name": "x", "days": "many", "scope": "read"}, "A token lasts from 1 to 90 days."),
    ({"name": "x", "days": "7", "scope": "admin"}, "Choose what the token may do"),
])
def test_a_token_made_wrong_is_refused_with_why_and_nothing_is_made(client, on_call, posted, problem):
    client.force_login(on_call)
    response = client.post(reverse("approver:token_list"), posted)
    assert response.status_code == 400 and problem in response.content.decode()
    assert not PersonalToken.objects.exists()


def test_someone_with_no_role_makes_no_token_and_nobody_revokes_anothers(client, outsider, on_call,
                                                                       approver_user):
    client.force_login(outsider)
    assert client.post(reverse("approver:token_list"), {"name": "x", "days": "7"}).status_code == 403
    theirs, _ = services.make_token(user=on_call, name="theirs", days=7)
    client.force_login(approver_user)
    assert client.post(reverse("approver:token_revoke", args=[theirs.pk])).status_code == 404
    assert PersonalToken.objects.get().revoked_at is None


def test_a_token_acts_with_its_persons_roles_and_teams_as_they_are_now(on_call, run, settings):
    _, token = services.make_token(user=on_call, name="t", days=7)
    api = Client()
    detail = reverse("api:run_detail", args=[run.public_id])
    assert api.get(detail, headers=bearer(token)).status_code == 200
    # The run's team stops counting everyone: Olivia is in no team that has it.
    Team.objects.filter(name=settings.DEFAULT_TEAM).update(everyone=False)
    missing = api.get(detail, headers=bearer(token))
    assert missing.status_code == 404 and missing.json() == {"error": "No such run among those you may see."}
    assert api.get(reverse("api:run_list"), headers=bearer(token)).json()["items"] == []
    Team.objects.get(name=settings.DEFAULT_TEAM).members.add(on_call)
    assert api.get(detail, headers=bearer(token)).status_code == 200
    on_call.groups.clear()  # no role any more
    refused = api.get(detail, headers=bearer(token))
    assert refused.status_code == 403 and "none of the roles" in refused.json()["error"]
    on_call.groups.add(Group.objects.get(name=roles.ON_CALL))
    on_call.is_active = False
    on_call.save()
    assert api.get(detail, headers=bearer(token)).status_code == 401


def test_an_expired_token_and_a_malformed_header_open_nothing(on_call, run):
    row, token = services.make_token(user=on_call, name="t", days=1)
    api = Client()
    PersonalToken.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api.get(reverse("api:run_list"), headers=bearer(token)).status_code == 401
    for header in ("Bearer", "Basic dXNlcjpwYXNz", f"Bearer {token}x", "Bearer agt_" + "x" * 40):
        answer = api.get(reverse("api:run_list"), headers={"Authorization": header})
        assert answer.status_code == 401 and answer.json()["error"], header


def test_the_write_api_checks_a_request_as_the_run_page_does_and_says_what_is_wrong(on_call, run):
    _, token = services.make_token(user=on_call, name="t", days=7, scope="undo")
    api = Client()
    ask = reverse("api:ask_from_run", args=[run.public_id])

    def post(body):
        return api.post(ask, body, content_type="application/json", headers=bearer(token))

    neither = post({"reason": "r"})
    assert neither.status_code == 422
    assert neither.json()["error"] == "Tick the steps to undo, or undo from one step onwards."
    no_reason = post({"fromStep": 1, "reason": ""})
    assert no_reason.status_code == 422 and "Say why this should be undone" in no_reason.json()["error"]
    typed = post({"fromStep": "first", "reason": "r"})
    assert typed.status_code == 422 and typed.json()["error"].startswith("The request is not what this call")
    chosen = post({"steps": [2], "reason": "the second call was wrong"})
    assert chosen.status_code == 201, chosen.content
    plan = chosen.json()
    assert plan["state"] == "drafting" and Plan.objects.get().chosen_steps == [2]
    assert Plan.objects.get().requested_by == on_call
    services.draft_plan(plan=Plan.objects.get())  # as the worker does: its steps are now in an open plan
    taken = post({"steps": [2], "reason": "again"})
    assert taken.status_code == 409 and taken.json()["openPlan"] == plan["id"]
    paused = api.post(reverse("api:pause", args=[plan["id"]]), headers=bearer(token))
    assert paused.status_code == 403  # pausing is for approvers and admins, as on the page
    cancelled = api.post(reverse("api:cancel", args=[plan["id"]]), headers=bearer(token))
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = api.post(reverse("api:cancel", args=[plan["id"]]), headers=bearer(token))
    assert again.status_code == 409 and again.json()["error"] == (
        "This plan is cancelled; it can no longer be cancelled.")


def test_an_undo_since_through_the_api_needs_a_moment_with_its_offset(on_call, run):
    _, token = services.make_token(user=on_call, name="t", days=7, scope="undo")
    api = Client()
    url = reverse("api:ask_since", args=["sales-bot"])
    naive = api.post(url, {"since": "2026-11-29T09:00:00", "reason": "r"}, content_type="application/json",
                     headers=bearer(token))
    assert naive.status_code == 422 and "with its offset" in naive.json()["error"]
    asked = api.post(url, {"since": "2026-11-29T09:00:00Z", "reason": "r"}, content_type="application/json",
                     headers=bearer(token))
    assert asked.status_code == 201 and Plan.objects.get().since is not None
    unknown = api.post(reverse("api:ask_since", args=["nobody"]), {"since": "2026-11-29T09:00:00Z",
                       "reason": "r"}, content_type="application/json", headers=bearer(token))
    assert unknown.status_code == 404


def test_a_session_must_send_its_csrf_token_to_write_and_a_token_need_not(on_call, run):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(on_call)
    ask = reverse("api:ask_from_run", args=[run.public_id])
    refused = browser.post(ask, {"fromStep": 1, "reason": "r"}, content_type="application/json")
    assert refused.status_code == 403 and not Plan.objects.exists()
    _, token = services.make_token(user=on_call, name="t", days=7, scope="undo")
    scripted = Client(enforce_csrf_checks=True)
    assert scripted.post(ask, {"fromStep": 1, "reason": "r"}, content_type="application/json",
                         headers=bearer(token)).status_code == 201


def test_the_openapi_document_is_generated_from_the_code_and_read_by_readers_only(on_call, outsider):
    api = Client()
    assert api.get(reverse("api:openapi-json")).status_code == 401
    _, token = services.make_token(user=on_call, name="t", days=7)
    schema = api.get(reverse("api:openapi-json"), headers=bearer(token)).json()
    assert schema["info"]["title"] == "Agent undo"
    paths = schema["paths"]
    assert set(paths["/api/runs/{run_id}/plans/"]) == {"post"}
    assert set(paths["/api/plans/{plan_id}/"]) == {"get"}
    assert {"pause", "resume", "abort", "cancel"} <= {p.rstrip("/").rsplit("/", 1)[1] for p in paths}
    assert {"PlanOut", "RunOut", "StepOut", "FromRun", "Since"} <= set(schema["components"]["schemas"])
    assert "report" in schema["components"]["schemas"]["PlanOut"]["properties"]
    assert schema["components"]["securitySchemes"]["PersonalTokenAuth"]["scheme"] == "bearer"
    client = Client()
    client.force_login(outsider)
    assert client.get(reverse("api:openapi-json")).status_code == 403
