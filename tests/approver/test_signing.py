"""What a passkey signs, as pure functions."""

from datetime import UTC, datetime, timedelta

import pytest

from approver import signing

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def test_the_challenge_binds_every_field_and_ignores_key_order():
    base = {
        "plan": "p",
        "digest": "d" * 64,
        "decision": "approve",
        "choices": {"3": "overwrite"},
        "nonce": "n",
    }
    same = signing.challenge(dict(reversed(list(base.items()))))
    assert signing.challenge(base) == same and len(same) == 32
    for key, other in [("plan", "q"), ("digest", "e" * 64), ("decision", "reject"),
                       ("choices", {"3": "keep_newer"}), ("nonce", "m")]:
        assert signing.challenge({**base, key: other}) != same


def test_an_approval_never_outlives_the_first_undo_deadline():
    soon = NOW + timedelta(hours=2)
    assert (
        signing.expiry(now=NOW, valid_for=timedelta(hours=24), deadlines=[soon, NOW + timedelta(days=3)])
        == soon
    )
    assert signing.expiry(now=NOW, valid_for=timedelta(hours=1), deadlines=[soon]) == NOW + timedelta(hours=1)
    assert signing.expiry(now=NOW, valid_for=timedelta(hours=1), deadlines=[]) == NOW + timedelta(hours=1)


@pytest.mark.parametrize("raw", [["3"], {"x": "overwrite"}, {"03": "overwrite", "3": "keep_newer"}])
def test_choices_are_refused_unless_they_name_conflicts(raw):
    with pytest.raises(signing.SigningRefused):
        signing.clean_choices(raw, conflicts={3}, decision="approve")


def test_a_rejection_needs_no_choices():
    assert signing.clean_choices(None, conflicts={3}, decision="reject") == {}


def test_what_changed_since_signing_is_said_in_words():
    signed = {"plan": "p", "items": [{"position": 1, "step": 3, "check": {"status": "ok"}}]}
    now = {"plan": "p", "items": [{"position": 1, "step": 3, "check": {"status": "conflict"}},
                                  {"position": 2, "step": 2}]}
    assert signing.content_changes(signed, now) == [
        "Step 3: its check went from “would work now” to “changed since”.", "Step 2 was added."]
