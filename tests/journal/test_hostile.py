"""Tool servers may be wrong or hostile: what they send is checked, recorded faithfully, and never trusted."""

import copy

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from journal import services
from journal.mcp.gateway import agent_tools
from journal.record import chain
from journal.record.canonical import to_ijson

from .factories import crm_server, journal_call

KEY = Ed25519PrivateKey.generate()
PUBLIC = chain.b64url(
    KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
)


def signed_result(journal: dict, key=KEY, key_id="crm-1") -> dict:
    receipt = {"keyId": key_id, "alg": "Ed25519", "signature": chain.sign(key, to_ijson(journal))}
    return {
        "content": [{"type": "text", "text": "ok"}],
        "_meta": {"hatp/journal": {**journal, "receipt": receipt}},
    }


JOURNAL = {"undo": {"kind": "compensate", "window": "P7D"}, "compensationToken": "ctk_1",
           "effect": {"summary": "Deal D-881 stage: Proposal → Won", "resource": "crm://acme/deal/D-881",
                      "version": "v13"}}


@pytest.fixture
def agent(dana):
    return services.create_agent(name="sales-bot", on_behalf_of=dana)[0]


@pytest.fixture
def crm(db):
    return crm_server(receipt_keys=[{"keyId": "crm-1", "alg": "Ed25519", "publicKey": PUBLIC}])


def test_a_genuine_receipt_verifies(agent, crm):
    assert journal_call(agent, server=crm, result=signed_result(JOURNAL)).receipt_verified is True


def test_a_receipt_over_other_content_does_not_verify(agent, crm):
    result = signed_result(JOURNAL)
    result["_meta"]["hatp/journal"]["effect"]["version"] = "v99"  # changed after signing
    step = journal_call(agent, server=crm, result=result)
    assert step.receipt_verified is False and "does not verify" in step.receipt_problem
    assert step.effect_version == "v99"  # recorded faithfully, flagged as unverified


def test_a_receipt_by_an_unknown_key_does_not_verify(agent, crm):
    step = journal_call(
        agent, server=crm, result=signed_result(JOURNAL, key=Ed25519PrivateKey.generate(), key_id="x")
    )
    assert step.receipt_verified is False and "unknown receipt key" in step.receipt_problem


def test_a_server_cannot_swap_a_pinned_receipt_key(crm):
    tools = copy.deepcopy(crm.catalogue)
    other = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                   serialization.PublicFormat.Raw)
    tools[0]["_meta"]["hatp/journal"]["receiptKeys"][0]["publicKey"] = chain.b64url(other)
    server = services.save_catalogue(server=crm, tools=tools)
    assert server.receipt_keys == {"crm-1": PUBLIC}
    assert "receipt key crm-1 changed" in server.catalogue_error


def test_oversized_or_mistyped_call_metadata_is_reported_not_trusted(agent, crm):
    hostile = copy.deepcopy(JOURNAL)
    hostile["effect"]["summary"] = "x" * 5000
    step = journal_call(agent, server=crm, result={"content": [], "_meta": {"hatp/journal": hostile}})
    assert step.effect_summary == ""
    assert any("effect.summary" in problem for problem in step.undo_problems)
    assert not step.automatically_undoable


def test_a_compensation_token_without_a_version_needs_a_human(agent, crm):
    journal = copy.deepcopy(JOURNAL)
    del journal["effect"]["version"]
    step = journal_call(agent, server=crm, result=signed_result(journal))
    assert step.reversibility == "compensate" and step.badge == ("needs-human", "Reversible with a human")
    assert any("no version" in problem for problem in step.undo_problems)


def test_values_beyond_ijson_are_kept_and_the_chain_still_verifies(agent, crm):
    result = {"content": [], "structuredContent": {"huge": 2**70, "text": "bad \ud800 surrogate"}}
    step = journal_call(agent, server=crm, result=result)
    assert step.result["structuredContent"]["huge"] == str(2**70)
    services.checkpoint_run(run=step.run)
    assert services.verify_run(run=step.run).ok


def test_invalid_catalogue_entries_are_kept_but_never_shown_to_agents(crm):
    tools = [
        *crm.catalogue,
        5,
        {"name": 7},
        {"name": "bad_schema", "inputSchema": "nope"},
        {"description": "nameless"},
    ]
    server = services.save_catalogue(server=crm, tools=tools)
    names = [tool.name for tool in agent_tools([server])]
    assert names == ["crm__update_deal"]
