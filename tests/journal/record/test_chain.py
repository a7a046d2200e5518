"""The run record's chain and checkpoints, as pure functions: every single-entry tampering is found."""

import copy
import hashlib

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.record import chain

RUN = "3f1c2a9e-0000-4000-8000-000000000001"


def build(n: int = 6):
    entries, prev = [], chain.GENESIS
    for seq in range(1, n + 1):
        entry = chain.make_entry(
            seq=seq,
            ts=f"2026-11-29T10:00:0{seq}.000000Z",
            event="call" if seq % 2 else "result",
            data={"step": (seq + 1) // 2, "value": [seq, "x" * seq]},
            prev_hash=prev,
        )
        entries.append(entry)
        prev = entry["hash"]
    return entries


def signed(entries, key, key_id="k1", at=None):
    seq = at or entries[-1]["seq"]
    head = entries[seq - 1]["hash"]
    payload = chain.checkpoint_payload(run=RUN, seq=seq, head_hash=head)
    return {"run": RUN, "seq": seq, "headHash": head, "keyId": key_id, "signature": chain.sign(key, payload)}


@pytest.fixture
def key():
    return Ed25519PrivateKey.generate()


def verify(entries, checkpoints, key):
    return chain.verify(
        run=RUN, entries=entries, checkpoints=checkpoints, public_keys={"k1": key.public_key()}
    )


def test_an_untouched_chain_with_a_checkpoint_is_intact(key):
    entries = build()
    verdict = verify(entries, [signed(entries, key)], key)
    assert verdict.ok, str(verdict)
    assert verdict.entries == 6 and verdict.checkpoints == 1


def test_the_first_entry_links_to_genesis_and_hash_covers_everything_but_itself():
    first = build(1)[0]
    assert first["prevHash"] == "GENESIS"
    assert first["hash"] == chain.entry_hash(first)


@pytest.mark.parametrize("position", range(6))
@pytest.mark.parametrize("field", ["ts", "event", "data"])
def test_changing_any_field_of_any_entry_is_detected_at_that_entry(key, position, field):
    entries = build()
    checkpoints = [signed(entries, key)]
    tampered = copy.deepcopy(entries)
    tampered[position][field] = {"forged": True} if field == "data" else "forged"
    verdict = verify(tampered, checkpoints, key)
    assert not verdict.ok
    assert verdict.bad_seq == position + 1


@pytest.mark.parametrize("position", range(6))
def test_changing_and_rehashing_an_entry_breaks_the_next_link_or_the_checkpoint(key, position):
    entries = build()
    checkpoints = [signed(entries, key)]
    tampered = copy.deepcopy(entries)
    body = {k: v for k, v in tampered[position].items() if k != "hash"}
    body["data"] = {"forged": True}
    tampered[position] = {**body, "hash": chain.entry_hash(body)}
    verdict = verify(tampered, checkpoints, key)
    assert not verdict.ok
    assert verdict.bad_seq == (position + 2 if position < 5 else 6)


@pytest.mark.parametrize("position", range(6))
def test_removing_any_entry_is_detected(key, position):
    entries = build()
    checkpoints = [signed(entries, key, at=6)]
    tampered = entries[:position] + entries[position + 1:]
    verdict = verify(tampered, checkpoints, key)
    assert not verdict.ok
    assert verdict.bad_seq == position + 1


@pytest.mark.parametrize("position", range(6))
def test_inserting_an_entry_before_any_entry_is_detected(key, position):
    entries = build()
    checkpoints = [signed(entries, key)]
    forged = chain.make_entry(seq=position + 1, ts="2026-11-29T10:00:00.000000Z", event="call", data={},
                              prev_hash=entries[position - 1]["hash"] if position else chain.GENESIS)
    tampered = entries[:position] + [forged] + entries[position:]
    verdict = verify(tampered, checkpoints, key)
    assert not verdict.ok
    assert verdict.bad_seq is not None and verdict.bad_seq <= position + 2


@pytest.mark.parametrize("position", range(5))
def test_swapping_neighbours_is_detected(key, position):
    entries = build()
    tampered = list(entries)
    tampered[position], tampered[position + 1] = tampered[position + 1], tampered[position]
    verdict = verify(tampered, [signed(entries, key)], key)
    assert not verdict.ok
    assert verdict.bad_seq == position + 1


def test_cutting_the_tail_after_a_checkpoint_is_detected(key):
    entries = build()
    checkpoints = [signed(entries, key, at=4)]
    verdict = verify(entries[:3], checkpoints, key)
    assert not verdict.ok
    assert verdict.bad_seq == 4
    assert "cut" in verdict.problem


def test_cutting_the_tail_with_no_checkpoint_past_it_goes_unnoticed_which_is_why_we_checkpoint(key):
    entries = build()
    assert verify(entries[:4], [signed(entries, key, at=4)], key).ok


def test_a_forged_checkpoint_signature_is_refused(key):
    entries = build()
    checkpoint = signed(entries, key)
    checkpoint["signature"] = chain.sign(Ed25519PrivateKey.generate(), {"run": RUN})
    verdict = verify(entries, [checkpoint], key)
    assert not verdict.ok and "signature" in verdict.problem


def test_a_checkpoint_from_an_unknown_key_is_refused(key):
    entries = build()
    verdict = verify(entries, [signed(entries, key, key_id="k9")], key)
    assert not verdict.ok


def test_a_checkpoint_of_another_run_is_refused(key):
    entries = build()
    checkpoint = signed(entries, key)
    checkpoint["run"] = "another"
    assert not verify(entries, [checkpoint], key).ok


def test_checkpoints_by_old_and_new_keys_both_verify():
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    entries = build()
    checkpoints = [signed(entries, old, "old", at=3), signed(entries, new, "new", at=6)]
    verdict = chain.verify(run=RUN, entries=entries, checkpoints=checkpoints,
                           public_keys={"old": old.public_key(), "new": new.public_key()})
    assert verdict.ok


ENTRY_DATA = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=st.integers(1, 2**53 - 1), ts=st.text(), event=st.text(), prev=st.text(), data=ENTRY_DATA)
def test_an_entrys_hash_from_its_members_is_the_hash_of_the_whole_entry(seq, ts, event, prev, data):
    body = {"seq": seq, "ts": ts, "event": event, "data": data, "prevHash": prev}
    digest, data_bytes = chain.entry_digest({**body, "hash": "x"})
    assert digest == hashlib.sha256(rfc8785.dumps(body)).hexdigest()
    assert data_bytes == rfc8785.dumps(data)


@pytest.mark.parametrize("entry", [
    {"seq": 1, "ts": "t", "event": "e", "data": {}, "prevHash": "p", "extra": 1},
    {"seq": 1.0, "ts": "t", "event": "e", "data": {}, "prevHash": "p"},
    {"seq": True, "ts": "t", "event": "e", "data": {}, "prevHash": "p"},
    {"seq": 1, "ts": "t", "event": "e", "data": {}},
])
def test_an_entry_of_other_members_or_types_is_hashed_whole(entry):
    assert chain.entry_digest(entry) == (hashlib.sha256(rfc8785.dumps(entry)).hexdigest(), None)
