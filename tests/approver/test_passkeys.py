"""Approvers enrol, name and revoke passkeys; a browser's answer that does not hold enrols nothing."""

import json

import pytest
from django.test import Client
from django.urls import reverse
from webauthn.helpers import base64url_to_bytes

from approver import passkeys, services
from approver.models import Passkey

from .softkey import UP, SoftKey

pytestmark = pytest.mark.django_db

ORIGIN = "http://localhost:8000"


@pytest.fixture(autouse=True)
def relying_party(settings):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [ORIGIN]


def options(client) -> dict:
    response = client.post(reverse("approver:passkey_options"))
    assert response.status_code == 200
    return response.json()


def enrol(client, answer: dict, name: str = "Work laptop"):
    return client.post(reverse("approver:passkey_enroll"), json.dumps({"name": name, "credential": answer}),
                       content_type="application/json")


def test_an_approver_enrols_a_passkey_and_sees_it_listed(approver_user, client):
    client.force_login(approver_user)
    offered = options(client)
    assert offered["rp"] == {"id": "localhost", "name": "Agent undo"}
    assert offered["authenticatorSelection"]["userVerification"] == "required"
    key = SoftKey()
    response = enrol(client, key.register(base64url_to_bytes(offered["challenge"])))
    assert response.status_code == 200 and response.json()["ok"] is True
    passkey = Passkey.objects.get()
    assert (passkey.user, passkey.name, passkey.sign_count, passkey.transports) == (
        approver_user, "Work laptop", 0, ["internal"])
    page = client.get(reverse("approver:passkey_list")).content.decode()
    assert "Work laptop" in page and "Revoke" in page
    # The same device cannot be enrolled twice: it is excluded from the next options.
    assert options(client)["excludeCredentials"][0]["id"] == passkey.credential_id


@pytest.mark.parametrize(("tamper", "why"), [
    ({"origin": "https://evil.example"}, "origin"),
    ({"rp_id": "evil.example"}, "RP ID"),
    ({"flags": UP | 0x40}, "verif"),
])
def test_an_answer_for_another_site_or_without_user_verification_is_refused(
    approver_user, client, tamper, why
):
    client.force_login(approver_user)
    challenge = base64url_to_bytes(options(client)["challenge"])
    response = enrol(client, SoftKey().register(challenge, **tamper))
    assert response.status_code == 400 and why.lower() in response.json()["error"].lower()
    assert not Passkey.objects.exists()


def test_a_challenge_answers_once_and_only_the_one_we_issued(approver_user, client):
    client.force_login(approver_user)
    challenge = base64url_to_bytes(options(client)["challenge"])
    key = SoftKey()
    answer = key.register(challenge)
    assert (
        enrol(client, key.register(b"x" * 32)).status_code == 400
    )  # not our challenge (and it is now used up)
    replay = enrol(client, answer)
    assert replay.status_code == 400 and "start again" in replay.json()["error"]
    assert not Passkey.objects.exists()


@pytest.mark.parametrize("body", ["not json", json.dumps([1, 2]), json.dumps({"credential": "garbage"}),
                                  json.dumps({"credential": {"id": 1, "response": None}})])
def test_malformed_answers_get_a_clear_error_not_a_crash(approver_user, client, body):
    client.force_login(approver_user)
    options(client)
    response = client.post(reverse("approver:passkey_enroll"), body, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]
    assert not Passkey.objects.exists()


def test_the_same_passkey_cannot_be_enrolled_twice(approver_user):
    key = SoftKey()
    services.enroll_passkey(
        user=approver_user, name="one", credential=key.register(b"c" * 32), challenge=b"c" * 32
    )
    with pytest.raises(passkeys.PasskeyRefused, match="already enrolled"):
        services.enroll_passkey(user=approver_user, name="two", credential=key.register(b"d" * 32),
                                challenge=b"d" * 32)


def test_revoking_keeps_the_key_on_record_but_marks_it(approver_user, second_approver, client):
    key = services.enroll_passkey(user=approver_user, name="laptop", credential=SoftKey().register(b"c" * 32),
                                  challenge=b"c" * 32)
    client.force_login(second_approver)
    assert client.post(reverse("approver:passkey_revoke", args=[key.pk])).status_code == 404  # not theirs
    client.force_login(approver_user)
    client.post(reverse("approver:passkey_revoke", args=[key.pk]))
    key.refresh_from_db()
    assert key.revoked_at is not None and Passkey.objects.active().count() == 0


@pytest.mark.parametrize("persona", ["on_call", "admin_user", "outsider"])
def test_only_approvers_have_passkeys(persona, request, client):
    client.force_login(request.getfixturevalue(persona))
    assert client.get(reverse("approver:passkey_list")).status_code == 403
    assert client.post(reverse("approver:passkey_options")).status_code == 403


def test_enrolling_needs_the_csrf_token(approver_user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver_user)
    assert client.post(reverse("approver:passkey_options")).status_code == 403
