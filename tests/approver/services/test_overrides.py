"""Overwriting a newer change is an override: asked for by name with a written reason, shown to every other
approver before they sign, journaled as its own event, in the report; approvers who signed different choices
make no quorum, and the page says so."""

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from approver import notifications, services, signing
from approver.models import Approval

from ..test_notifications import emails  # noqa: F401 - a fixture
from .test_approvals import WHY, approve, conflicted_plan, enrolled, relying_party  # noqa: F401 - fixtures, helpers
from .test_executor import approved, run_plan  # noqa: F401 - a fixture and a helper

pytestmark = pytest.mark.django_db(transaction=True)


def page(plan, user) -> str:
    web = Client()
    web.force_login(user)
    response = web.get(services.plan_url(plan))
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.parametrize("overrides, refusal", [
    ({}, "Overwriting a newer change is an override: say why"),
    ({"3": "   "}, "say why"),
    ({"3": 7}, "the reason must be text"),
    ({"3": "x" * 1001}, "under 1000 characters"),
    ({"3": WHY, "2": WHY}, "Item 2: a reason goes with an overwrite"),
    (["3"], "Override reasons must map"),
])
def test_an_overwrite_without_a_reason_is_refused_and_nothing_is_asked(
    conflicted_plan, approver_user, overrides, refusal  # noqa: F811 - the fixture imported above
):
    enrolled(approver_user)
    with pytest.raises(signing.SigningRefused, match=refusal):
        services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve",
                               choices={"3": "overwrite"}, overrides=overrides)
    assert not conflicted_plan.signing_requests.exists()


def test_keeping_the_newer_change_needs_no_reason_and_takes_none(
    conflicted_plan, approver_user  # noqa: F811 - the fixture imported above
):
    enrolled(approver_user)
    with pytest.raises(signing.SigningRefused, match="Item 3: a reason goes with an overwrite"):
        services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve",
                               choices={"3": "keep_newer"}, overrides={"3": WHY})
    request, _ = services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve",
                                        choices={"3": "keep_newer"})
    assert request.overrides == {}


def test_an_override_is_signed_journaled_and_shown_to_the_next_approver(
    conflicted_plan, approver_user, second_approver  # noqa: F811 - the fixture imported above
):
    first = approve(conflicted_plan, approver_user, enrolled(approver_user), overrides={"3": f"  {WHY} "})
    deal = conflicted_plan.items.get(position=3)
    assert (deal.conflict_choice, deal.override_reason, deal.override_by) == ("overwrite", WHY, approver_user)
    # The reason is in the signed content, so the digest binds it: every approver signs the same words.
    assert first.content["items"][2]["overrideReason"] == WHY and first.overrides == {"3": WHY}
    [override] = conflicted_plan.run.entries.filter(event="override")
    assert override.data == {
        "plan": str(conflicted_plan.public_id), "item": 3, "step": 2, "by": "ana", "reason": WHY,
        "agentLeft": "v13", "overwrites": "v14", "changedBy": "priya", "digest": first.digest,
    }
    # Bo sees the override, by name and with its reason, before he signs; his form comes with it.
    bo = enrolled(second_approver)
    html = page(conflicted_plan, second_approver)
    assert "ana asked to overwrite priya&#x27;s newer change" in html and WHY.replace("'", "&#x27;") in html
    assert 'class="overrides-to-sign"' in html and "item 3 by ana" in html
    assert f'name="override-3" maxlength="1000" rows="2">{WHY.replace(chr(39), "&#x27;")}</textarea>' in html
    approve(conflicted_plan, second_approver, bo)  # the same choice and words
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "approved"
    assert conflicted_plan.run.entries.filter(event="override").count() == 1  # Bo asked for nothing new
    api = Client()
    api.force_login(second_approver)
    body = api.get(reverse("api:plan_detail", args=[conflicted_plan.public_id])).json()
    assert body["overrides"] == [{"item": 3, "by": "ana", "at": deal.override_at.isoformat(), "reason": WHY}]


def test_approvers_who_signed_different_choices_make_no_quorum_and_the_page_says_so(
    conflicted_plan, approver_user, second_approver  # noqa: F811 - the fixture imported above
):
    approve(conflicted_plan, approver_user, enrolled(approver_user))
    # Bo overwrites too, but for his own reason: that is another plan than the one Ana signed.
    approve(conflicted_plan, second_approver, enrolled(second_approver), overrides={"3": "Bo's own reason"})
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "ready"
    assert [a.approver for a in services.counting_approvals(plan=conflicted_plan)] == [second_approver]
    assert [e.data["by"] for e in conflicted_plan.run.entries.filter(event="override")] == ["ana", "bo"]
    html = page(conflicted_plan, approver_user)
    assert "The approvers did not all sign the same choices, so the plan will not run" in html
    assert "the reason to overwrite went from" in html  # what changed since Ana signed


def test_the_report_and_the_email_list_the_override(
    approved, approver_user, emails, settings  # noqa: F811 - the fixtures imported above
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    plan = run_plan(approved("overwrite"))
    html = page(plan, approver_user)
    report = html[html.index('id="report"'):html.index('id="will-be-undone"')]
    assert "<h3>Overrides</h3>" in report and "ana asked to overwrite priya&#x27;s newer change" in report
    assert "signed by ana and bo" in report and "Undone" in report.split('id="override-report-3"')[1][:900]
    mail.outbox.clear()
    notifications.plan_executed(plan)
    [message] = mail.outbox
    assert ("Override, step 2 (crm://acme/deal/D-881): ana asked to overwrite priya's newer change: “"
            + WHY) in message.body
    assert Approval.objects.filter(plan=plan, overrides={"3": WHY}).count() == 2


def test_a_conflicted_undo_reads_as_the_change_it_makes(
    conflicted_plan, approver_user  # noqa: F811 - the fixture imported above
):
    deal = conflicted_plan.items.select_related("step").get(position=3)
    assert "wouldDo" not in deal.check_detail  # a conflict: the server did not say what the undo would do
    html = page(conflicted_plan, approver_user)
    item = html[html.index('id="item-3"'):]
    assert "Put back stage: Won → Proposal (the agent&#x27;s change was “Deal D-881" in item[:600]
    assert "Undo: Deal D-881" not in html
    api = Client()
    api.force_login(approver_user)
    body = api.get(reverse("api:plan_detail", args=[conflicted_plan.public_id])).json()
    assert body["undo"][-1]["does"].startswith("Put back stage: Won → Proposal")


def test_an_admin_who_is_not_an_approver_is_told_why_there_is_no_sign_button(
    conflicted_plan, admin_user  # noqa: F811 - the fixture imported above
):
    html = page(conflicted_plan, admin_user)
    assert 'id="sign-off"' not in html
    assert "Signing is for approvers, and you are not one" in html


def test_the_sign_button_and_the_choices_say_what_they_do(
    conflicted_plan, approver_user, second_approver  # noqa: F811 - the fixture imported above
):
    ana = enrolled(approver_user)
    enrolled(second_approver)
    html = page(conflicted_plan, approver_user)
    assert "Leave it as priya left it: skip this undo" in html
    assert "Undo the stage anyway: priya&#x27;s amount change is kept" in html
    assert ("if you overwrite, only if still at version <code>v14</code> (the one you saw; the agent had "
            "left <code>v13</code>); if you keep the newer change, nothing is sent") in html
    assert "0 of 2 approvals that count; 2 more needed, from: ana, bo" in html
    assert "You are approval 1 of 2: 1 more will be needed after you." in html
    assert f'<code class="whole-digest">{conflicted_plan.digest}</code>' in html
    assert '<button type="submit" class="secondary">Check again</button>' in html
    approve(conflicted_plan, approver_user, ana)
    html = page(conflicted_plan, second_approver)
    assert "1 of 2 approvals that count; 1 more needed, from: bo" in html
    assert "You are approval 2 of 2: undoing starts as soon as you sign." in html
    assert "If anything changed, the approvals given so far no longer count." in html
