"""Signed approvals: bound to the exact plan, one use per challenge, separation of duties, quorum, expiry."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from webauthn.helpers import base64url_to_bytes

from approver import services, signing
from approver.models import Approval, ApprovalRules, Plan
from journal.auth import roles

from ..softkey import UP, SoftKey

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = "http://localhost:8000"


@pytest.fixture(autouse=True)
def relying_party(settings):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [ORIGIN]


def enrolled(user) -> SoftKey:
    key = SoftKey()
    services.enroll_passkey(user=user, name="laptop", credential=key.register(b"c" * 32), challenge=b"c" * 32)
    return key


@pytest.fixture
def conflicted_plan(globex, on_call, sample_servers) -> Plan:
    """The Globex plan from step 2, checked after a colleague raised the deal: one conflict (the deal)."""
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=2)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == "ready" and services.conflict_positions(plan) == {3}
    return plan


WHY = "The client confirmed the agent's change was wrong."


def sign(plan, user, key, decision="approve", choices=None, reason="", overrides=None, **tamper):
    """Sign as `user`; an overwrite goes with a reason (WHY) unless `overrides` gives others."""
    if overrides is None:
        overrides = {k: WHY for k, v in (choices or {}).items() if v == "overwrite" and decision == "approve"}
    request, options = services.begin_signing(
        plan=plan, user=user, decision=decision, choices=choices, overrides=overrides, reason=reason
    )
    assert base64url_to_bytes(request.challenge) == signing.challenge(signing.challenge_payload(
        plan=str(plan.public_id), digest=request.digest, decision=decision, choices=request.choices,
        nonce=request.nonce))
    return request, key.sign(base64url_to_bytes(request.challenge), **tamper)


def approve(plan, user, key, choices=None, overrides=None, **tamper) -> Approval:
    request, assertion = sign(
        plan, user, key, choices=choices if choices is not None else {"3": "overwrite"}, overrides=overrides,
        **tamper
    )
    return services.complete_signing(user=user, nonce=request.nonce, credential=assertion)


def test_two_approvers_sign_the_exact_plan_and_it_is_approved(
    conflicted_plan, approver_user, second_approver
):
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    first = approve(conflicted_plan, approver_user, ana)
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "ready"  # one of two
    deal = conflicted_plan.items.get(position=3)
    assert deal.conflict_choice == "overwrite"
    # The choice is in the signed content: the deal's undo now carries the version the approver saw.
    signed_deal = first.content["items"][2]
    assert signed_deal["conflictChoice"] == "overwrite" and signed_deal["compensation"]["ifVersion"] == "v14"
    assert first.digest == conflicted_plan.digest

    approve(conflicted_plan, second_approver, bo)
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "approved"
    assert {a.approver for a in services.counting_approvals(plan=conflicted_plan)} == {
        approver_user,
        second_approver,
    }
    events = [e.event for e in conflicted_plan.run.entries.order_by("seq")]
    # Ana's overwrite is an override, journaled as its own event; Bo signed the same one. From Ana's
    # approval on, the plan holds the records it will change (the deal and the meeting).
    assert events[-6:] == ["approval", "override", "lease_taken", "lease_taken", "approval", "plan_approved"]


def test_every_conflict_needs_a_choice_and_only_conflicts_take_one(conflicted_plan, approver_user):
    enrolled(approver_user)
    with pytest.raises(signing.SigningRefused, match="each change made since"):
        services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve", choices={})
    with pytest.raises(signing.SigningRefused, match="no conflict"):
        services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve",
                               choices={"3": "overwrite", "2": "keep_newer"})
    with pytest.raises(signing.SigningRefused, match="keep the newer change or to overwrite"):
        services.begin_signing(
            plan=conflicted_plan, user=approver_user, decision="approve", choices={"3": "yolo"}
        )


def test_the_requester_and_the_person_the_agent_acted_for_cannot_approve(conflicted_plan, on_call, dana):
    approvers = Group.objects.get_or_create(name=roles.APPROVER)[0]
    for user in (on_call, dana):
        user.groups.add(approvers)
        user = type(user).objects.get(pk=user.pk)  # fresh role cache
        enrolled(user)
        with pytest.raises(signing.SigningRefused, match="separation of duties"):
            services.begin_signing(
                plan=conflicted_plan, user=user, decision="approve", choices={"3": "overwrite"},
                overrides={"3": WHY}
            )
    ApprovalRules.objects.create(pk=1, separation_of_duties=False)
    fresh = type(on_call).objects.get(pk=on_call.pk)
    assert services.begin_signing(
        plan=conflicted_plan, user=fresh, decision="approve", choices={"3": "overwrite"}, overrides={"3": WHY}
    )


def test_a_tampered_assertion_is_refused_and_the_nonce_is_spent(conflicted_plan, approver_user):
    key = enrolled(approver_user)
    request, assertion = sign(conflicted_plan, approver_user, key, choices={"3": "overwrite"})
    signature = bytearray(base64url_to_bytes(assertion["response"]["signature"]))
    signature[-1] ^= 1
    from webauthn.helpers import bytes_to_base64url

    forged = {
        **assertion,
        "response": {**assertion["response"], "signature": bytes_to_base64url(bytes(signature))},
    }
    with pytest.raises(signing.SigningRefused, match="signature was not accepted"):
        services.complete_signing(user=approver_user, nonce=request.nonce, credential=forged)
    with pytest.raises(signing.SigningRefused, match="already used"):
        services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)
    assert not Approval.objects.exists()


def test_a_replayed_assertion_is_refused(conflicted_plan, approver_user):
    key = enrolled(approver_user)
    request, assertion = sign(conflicted_plan, approver_user, key, choices={"3": "overwrite"})
    services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)
    with pytest.raises(signing.SigningRefused, match="already used"):
        services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)
    # Against a fresh challenge (a rejection: her approval stands, so approving again is not offered), the
    # old signature does not hold either.
    fresh, _ = sign(conflicted_plan, approver_user, key, decision="reject", reason="second thoughts")
    with pytest.raises(signing.SigningRefused, match="not accepted"):
        services.complete_signing(user=approver_user, nonce=fresh.nonce, credential=assertion)
    assert Approval.objects.count() == 1


def test_an_assertion_for_another_plan_is_refused(conflicted_plan, approver_user, on_call, dana, settings):
    from journal import services as journal_services
    from tests.journal.factories import make_run

    settings.TOOL_SERVER_TIMEOUT = 2
    key = enrolled(approver_user)
    agent, _ = journal_services.create_agent(name="other-bot", on_behalf_of=dana)
    other = services.request_plan(run=make_run(agent, steps=2), requested_by=on_call, reason="r", from_step=1)
    other = services.run_checks(plan=other, check_round=other.check_round)
    assert other.state == "ready"
    _, signed_for_other = sign(other, approver_user, key, choices={})
    request, _ = sign(conflicted_plan, approver_user, key, choices={"3": "overwrite"})
    with pytest.raises(signing.SigningRefused, match="not accepted"):
        services.complete_signing(user=approver_user, nonce=request.nonce, credential=signed_for_other)
    assert not Approval.objects.exists()


def test_a_cloned_authenticator_with_a_stale_counter_is_refused(
    conflicted_plan, approver_user, second_approver
):
    key = enrolled(approver_user)
    approve(conflicted_plan, approver_user, key)  # counter now 1
    request, assertion = sign(conflicted_plan, approver_user, key, decision="reject", reason="wrong", count=1)
    # In words for the person signing, not the library's ("Response sign count of 1 was not greater…").
    with pytest.raises(signing.SigningRefused, match="not accepted: this passkey's signature counter went "
                                                     "backwards, which is what a copied passkey does"):
        services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)


def test_an_assertion_without_user_verification_is_refused(conflicted_plan, approver_user):
    key = enrolled(approver_user)
    with pytest.raises(signing.SigningRefused, match=r"not accepted: your passkey did not confirm it is you"):
        approve(conflicted_plan, approver_user, key, flags=UP)


def test_a_change_to_the_plan_voids_earlier_approvals(conflicted_plan, approver_user, second_approver):
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    first = approve(conflicted_plan, approver_user, ana, choices={"3": "overwrite"})
    # Bo chooses differently: the content changes, Ana's approval no longer counts, the plan is not approved.
    approve(conflicted_plan, second_approver, bo, choices={"3": "keep_newer"})
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "ready"
    assert [a.approver for a in services.counting_approvals(plan=conflicted_plan)] == [second_approver]
    changes = signing.content_changes(first.content, services.plan_content(conflicted_plan))
    assert any("the choice went from “undo it anyway” to “keep the newer change”" in c for c in changes)
    # Ana signs the new version and the quorum is reached.
    approve(conflicted_plan, approver_user, ana, choices={"3": "keep_newer"})
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "approved"


def test_a_plan_checked_again_after_signing_needs_signing_again(
    conflicted_plan, approver_user, sample_servers
):
    key = enrolled(approver_user)
    approve(conflicted_plan, approver_user, key)
    sample_servers.colleague_update("D-881", {"amount": 50000}, by="priya")
    assert services.queue_checks(plan=conflicted_plan, ring=False)
    plan = services.run_checks(plan=conflicted_plan, check_round=conflicted_plan.check_round)
    assert plan.state == "ready" and services.counting_approvals(plan=plan) == []
    # A new round asks again: choices made on the old answers are cleared, not carried onto new versions.
    assert set(plan.items.values_list("conflict_choice", flat=True)) == {""}


def test_expired_approvals_revoked_passkeys_and_lost_roles_stop_counting(conflicted_plan, approver_user,
                                                                          second_approver):
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    first = approve(conflicted_plan, approver_user, ana)
    assert first.expires_at <= timezone.now() + timedelta(hours=24)
    approve(conflicted_plan, second_approver, bo)
    conflicted_plan.refresh_from_db()
    assert len(services.counting_approvals(plan=conflicted_plan)) == 2
    Approval.objects.filter(pk=first.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert [a.approver for a in services.counting_approvals(plan=conflicted_plan)] == [second_approver]
    services.revoke_passkey(passkey=second_approver.passkeys.get())
    assert services.counting_approvals(plan=conflicted_plan) == []
    Approval.objects.filter(pk=first.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    approver_user.groups.clear()
    assert services.counting_approvals(plan=conflicted_plan) == []


def test_rejecting_needs_a_reason_ends_the_plan_and_frees_its_steps(conflicted_plan, approver_user):
    key = enrolled(approver_user)
    with pytest.raises(signing.SigningRefused, match="Say why"):
        services.begin_signing(plan=conflicted_plan, user=approver_user, decision="reject")
    request, assertion = sign(
        conflicted_plan, approver_user, key, decision="reject", reason="the deal is fine"
    )
    services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "rejected" and not conflicted_plan.items.filter(holds_step=True).exists()
    assert conflicted_plan.run.entries.order_by("-seq").first().data["reason"] == "the deal is fine"


def test_an_approver_without_a_passkey_is_told_to_enrol(conflicted_plan, approver_user):
    with pytest.raises(signing.SigningRefused, match="Enrol a passkey"):
        services.begin_signing(
            plan=conflicted_plan, user=approver_user, decision="approve", choices={"3": "overwrite"}
        )


def test_the_readme_verifier_checks_approvals_in_an_exported_bundle(conflicted_plan, approver_user, tmp_path):
    import json
    import subprocess
    import sys

    from tests.journal.test_run_record import export, readme_verifier

    approve(conflicted_plan, approver_user, enrolled(approver_user))
    path = export(conflicted_plan.run, tmp_path)
    script = readme_verifier(tmp_path)
    good = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip().endswith("1 signed approvals")

    # Claim the approver chose differently: the signature no longer covers it.
    bundle = json.loads(path.read_text())
    bundle["approvals"][0]["choices"] = {"3": "keep_newer"}
    path.write_text(json.dumps(bundle))
    bad = subprocess.run([sys.executable, script, path], capture_output=True, text=True)
    assert bad.returncode != 0 and "signed something else" in bad.stderr


def test_a_signature_begun_on_one_plan_is_not_completed_on_another(
    conflicted_plan, approver_user, on_call, globex
):
    key = enrolled(approver_user)
    request, assertion = sign(conflicted_plan, approver_user, key, choices={"3": "overwrite"})
    assert services.cancel_plan(plan=conflicted_plan, by=on_call)
    other = services.request_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=2)
    with pytest.raises(signing.SigningRefused, match="begun on another plan"):
        services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion, plan=other)
    request.refresh_from_db()
    assert request.used_at is None and not Approval.objects.exists()


def test_an_approver_who_signed_sees_that_she_has_and_cannot_sign_the_same_content_again(
    conflicted_plan, approver_user, second_approver
):
    """Issue 44, finding 1: after ana signed (1 of 2), the page told her "You are approval 2 of 2: undoing
    starts as soon as you sign" and offered the button again; a second signature was taken and listed as
    "does not count: ana may no longer approve". She is told she approved, and what the plan still needs,
    from whom; a second signature of the same content is refused, also one begun in another window."""
    from .test_overrides import page

    ana, bo = enrolled(approver_user), enrolled(second_approver)
    second_window, _ = services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve",
                                              choices={"3": "overwrite"}, overrides={"3": WHY})
    approve(conflicted_plan, approver_user, ana)
    conflicted_plan.refresh_from_db()
    html = page(conflicted_plan, approver_user)
    at = timezone.localtime(Approval.objects.get(approver=approver_user).created_at)
    assert (f"You approved this plan as it is now, on {at:%b %-d, %H:%M %Z}, choosing: deal D-881: undo it "
            "anyway. It needs 1 more approval, from bo.") in html
    assert 'id="sign-off"' not in html and "undoing starts as soon as you sign" not in html
    with pytest.raises(signing.SigningRefused, match="You approved this plan as it is now already"):
        services.begin_signing(plan=conflicted_plan, user=approver_user, decision="approve",
                               choices={"3": "overwrite"}, overrides={"3": WHY})
    with pytest.raises(signing.SigningRefused, match="nothing more was signed"):
        services.complete_signing(user=approver_user, nonce=second_window.nonce,
                                  credential=ana.sign(base64url_to_bytes(second_window.challenge)))
    assert conflicted_plan.approvals.count() == 1
    assert 'id="sign-off"' in page(conflicted_plan, second_approver)  # bo may sign
    approve(conflicted_plan, second_approver, bo)
    conflicted_plan.refresh_from_db()
    assert conflicted_plan.state == "approved"
