"""Admins edit autonomy policies on their pages (with a simulator), every change goes into a tamper-evident
log, and nobody else (least of all an agent) can reach them."""

import pytest
from django.urls import reverse

from approver import policy, services
from approver.models import AutonomyPolicy, PolicyChange
from journal import services as journal_services
from tests.journal.factories import crm_server, journal_call

pytestmark = pytest.mark.django_db(transaction=True)


def form_data(**overrides):
    data = {
        "name": "Careful",
        "scope": "everything",
        "approver_group": "approver",
        "quorum": 1,
        "ask_timeout": 60,
        "last": 200,
        **{f"decision_{k}": v for k, v in policy.DEFAULT_DECISIONS.items()},
    }
    data.update(overrides)
    return data


def test_an_admin_creates_a_policy_and_the_change_is_logged(client, admin_user):
    client.force_login(admin_user)
    response = client.post(reverse("approver:policy_new"), form_data(save="1"))
    assert response.status_code == 302
    row = AutonomyPolicy.objects.get()
    assert row.decisions == policy.DEFAULT_DECISIONS and row.scope == "everything"
    [change] = PolicyChange.objects.all()
    assert change.event == "policy_created" and change.data["by"] == "ada" and change.data["before"] is None
    assert change.data["after"]["decisions"]["none"] == "ask"
    page = client.get(reverse("approver:policy_list")).content.decode()
    assert "Careful" in page and "intact: 1 entry, 1 signed checkpoint" in page


def test_a_change_records_before_and_after_and_tampering_shows(client, admin_user):
    client.force_login(admin_user)
    client.post(reverse("approver:policy_new"), form_data(save="1"))
    row = AutonomyPolicy.objects.get()
    client.post(reverse("approver:policy_edit", args=[row.pk]), form_data(save="1", decision_none="deny"))
    change = PolicyChange.objects.get(seq=2)
    assert change.event == "policy_changed"
    assert (change.data["before"]["decisions"]["none"], change.data["after"]["decisions"]["none"]) == (
        "ask",
        "deny",
    )
    assert services.verify_policy_log().ok
    # Someone rewrites history in the database: the log names the change that no longer fits.
    PolicyChange.objects.filter(seq=1).update(data={**PolicyChange.objects.get(seq=1).data, "by": "mallory"})
    verdict = services.verify_policy_log()
    assert not verdict.ok and verdict.bad_seq == 1
    assert "broken at entry 1" in client.get(reverse("approver:policy_list")).content.decode()
    # Cutting the latest change off is seen too: the signed heads no longer match.
    PolicyChange.objects.filter(seq=1).update(data=change.data)  # any edit
    PolicyChange.objects.filter(seq=2).delete()
    assert not services.verify_policy_log().ok


def test_a_draft_that_does_not_hold_together_is_refused_and_nothing_is_saved(client, admin_user):
    client.force_login(admin_user)
    page = client.post(
        reverse("approver:policy_new"), form_data(save="1", scope="tool", tool="")
    ).content.decode()
    assert (
        "Choose the tool server this policy is for." in page and "Name the tool this policy is for." in page
    )
    server = crm_server()
    page = client.post(reverse("approver:policy_new"), form_data(save="1", scope="tool", server=server.pk,
                                                                 tool="drop_database")).content.decode()
    assert "crm offers no tool named &#x27;drop_database&#x27;." in page
    page = client.post(
        reverse("approver:policy_new"), form_data(save="1", decision_none="sometimes")
    ).content.decode()
    assert "Select a valid choice" in page
    assert not AutonomyPolicy.objects.exists() and not PolicyChange.objects.exists()
    client.post(reverse("approver:policy_new"), form_data(save="1"))
    page = client.post(reverse("approver:policy_new"), form_data(save="1", name="Again")).content.decode()
    assert "Another policy already covers this; edit that one instead." in page


def test_the_simulator_replays_recent_calls_against_the_draft(client, admin_user, dana):
    agent, _ = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    crm = crm_server()
    for n in range(3):
        journal_call(agent, server=crm, tool="update_deal", arguments={"n": n})
    journal_call(agent, server=crm, tool="purge", arguments={})  # not in the catalogue: unknown
    client.force_login(admin_user)
    response = client.post(reverse("approver:policy_new"), form_data(simulate="1", decision_unknown="deny"),
                           HTTP_HX_REQUEST="true")
    page = response.content.decode()
    assert page.lstrip().startswith('<section id="simulation">')  # the partial only
    assert "the last 4 calls" in page
    assert "<strong>3</strong> allowed" in page and "<strong>1</strong> denied" in page
    assert (
        "1 call would be decided differently from today, e.g. <code>crm__purge</code> (allow → deny)" in page
    )
    assert not AutonomyPolicy.objects.exists()  # simulating saves nothing


def test_deleting_a_policy_is_logged(client, admin_user):
    client.force_login(admin_user)
    client.post(reverse("approver:policy_new"), form_data(save="1"))
    row = AutonomyPolicy.objects.get()
    client.post(reverse("approver:policy_delete", args=[row.pk]))
    assert not AutonomyPolicy.objects.exists()
    last = PolicyChange.objects.order_by("-seq").first()
    assert last.event == "policy_deleted" and last.data["after"] is None and services.verify_policy_log().ok


def test_an_agent_cannot_reach_the_policies(client, dana, admin_user):
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for name in ("approver:policy_list", "approver:policy_new"):
        response = client.get(reverse(name), **bearer)
        assert response.status_code == 302 and response.url.startswith(reverse("login"))
    response = client.post(reverse("approver:policy_new"), form_data(save="1"), **bearer)
    assert response.status_code in (302, 403)
    assert client.get("/admin/autonomypolicy/", **bearer).status_code in (302, 404)
    assert not AutonomyPolicy.objects.exists()


def test_an_admin_sets_what_happens_when_a_call_fails_and_lets_repeats_through(client, admin_user):
    client.force_login(admin_user)
    form = client.get(reverse("approver:policy_new")).content.decode()
    assert "When a call fails" in form and "Unwind the run before answering" in form
    assert "Let repeats after an unknown outcome through" in form
    client.post(
        reverse("approver:policy_new"), form_data(save="1", on_failure="unwind", allow_unknown_retries="on")
    )
    row = AutonomyPolicy.objects.get()
    assert row.on_failure == "unwind" and row.allow_unknown_retries
    assert PolicyChange.objects.get().data["after"]["onFailure"] == "unwind"
    page = client.get(reverse("approver:policy_list")).content.decode()
    assert "on a failed call: unwind" in page and "repeats after an unknown outcome go through" in page
