"""The journal on its own: with no approval side plugged into its ports, the Recorder forwards every call,
holds none, and exports no signed decisions. With the approval side plugged in (as the app does when it
starts), its gate is the one the Recorder asks."""

import pytest

from journal import ports, services
from journal.models import Step

from .helpers import register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def journal_alone(monkeypatch):
    monkeypatch.setitem(ports._installed, "gate", ports.AllowEverything())
    monkeypatch.setitem(ports._installed, "signed_decisions", ports.no_decisions)


@pytest.fixture
def deny_everything(admin_user):
    from approver import policy
    from approver.models import AutonomyPolicy
    from approver.services import save_policy

    save_policy(row=AutonomyPolicy(name="Nothing", scope="everything",
                                   decisions=dict.fromkeys(policy.CLASSES, "deny")), by=admin_user)


def test_the_app_plugs_the_approval_sides_gate_in_when_it_starts():
    from approver.services.held_calls import HeldCallGate

    assert isinstance(ports.gate(), HeldCallGate)


def test_without_a_gate_every_call_is_forwarded_and_journaled_without_a_decision(
        journal_alone, deny_everything, recorder, sample_servers, dana):
    register_samples(sample_servers, names=("crm",))
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)

    async def script(client):
        return await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})

    result = run_agent(recorder, token, script)
    assert not result.is_error and "Proposal → Won" in result.content[0].text
    assert [entry["op"] for entry in sample_servers.ledger("crm")] == ["update_deal"]
    step = Step.objects.get()
    assert step.status == "ok" and step.policy_decision is None
    assert "policy" not in step.run.entries.get(event="call").data
    assert services.export_bundle(run=step.run)["approvals"] == []


def test_with_the_approval_sides_gate_the_same_call_is_refused(
    deny_everything, recorder, sample_servers, dana
):
    register_samples(sample_servers, names=("crm",))
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)

    async def script(client):
        return await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})

    result = run_agent(recorder, token, script)
    assert result.is_error and "Nothing was sent to crm" in result.content[0].text
    assert sample_servers.ledger("crm") == []
    assert Step.objects.get().policy_decision["decision"] == "deny"


def test_the_default_gate_holds_nothing():
    gate = ports.AllowEverything()
    assert gate.decide(agent_name="a", server_name="s", tool="t", declaration=None) is None
    assert gate.state(1) is None and gate.claim(held_id=1, opened=None, meta=None) is False
    with pytest.raises(RuntimeError, match="No policy gate is installed"):
        gate.hold(agent=None, server=None, tool="t", arguments={}, decision={}, run_id=1, step_id=1, now=None)
