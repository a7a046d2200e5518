"""Issue 44, finding 2: an override on a recipe server ends as the approvers signed it. The memory server's
undo of an agent's observation takes back only the agent's own observation: a colleague's newer one on the
same entity is kept, and the item is undone (not "failed" because the entity does not read as before the
agent). A file's undo writes its earlier bytes back: the person's newer edit is overwritten, as signed. The
report says which. Checked against the real servers' files."""

import json

import pytest
from django.test import Client

from approver import services, tasks
from journal import services as journal_services
from journal.models import Run
from tests.journal.helpers import run_agent
from tests.services import needs_node

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import run_plan
from .test_recipe_undo import pinned_server

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]

KICKOFF = {"type": "entity", "name": "Globex kickoff", "entityType": "meeting",
           "observations": ["booked for Dec 4"]}


@pytest.fixture
def memory(recorder, dana, admin_user, tmp_path, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    graph = tmp_path / "graph"
    pinned_server("memory", graph, by=admin_user, name="memory")
    (graph / "memory.jsonl").write_text(json.dumps(KICKOFF) + "\n")
    return graph / "memory.jsonl", journal_services.create_agent(name="notes-bot", on_behalf_of=dana)[1]


def entities(path):
    return {r["name"]: r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "entity"}


def signed_over(plan, approvers) -> None:
    conflict = plan.items.get(check_status="conflict")
    for user in approvers:
        approve(plan, user, enrolled(user), choices={str(conflict.position): "overwrite"})


def test_undoing_an_observation_over_a_colleagues_newer_one_keeps_hers_and_is_undone(
        recorder, memory, on_call, approver_user, second_approver):
    path, token = memory

    async def script(client):
        await client.call_tool("memory__add_observations", {"observations": [
            {"entityName": "Globex kickoff", "contents": ["agenda sent"]}]})

    run_agent(recorder, token, script)
    graph = entities(path)
    graph["Globex kickoff"]["observations"].append("moved to Friday")  # priya, on the graph, afterwards
    path.write_text("".join(json.dumps(r) + "\n" for r in graph.values()))

    plan = services.request_plan(run=Run.objects.get(agent__name="notes-bot"), requested_by=on_call,
                                 reason="wrong meeting", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    web = Client()
    web.force_login(approver_user)
    enrolled(approver_user)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    # The thing, not the tool; the rows in words, not JSON Pointers and arrays; no promise of what is kept.
    assert "Delete exactly the observations the call added: Globex kickoff" in page
    assert ("<code>Globex kickoff › observations</code></th><td data-label=\"Before the agent\">booked for "
            "Dec 4</td>") in page
    assert "Undo it anyway, over the newer change: delete exactly the observations the call added" in page
    assert "/entities" not in page and "is kept" not in page
    signed_over(plan, (approver_user, second_approver))
    plan = run_plan(plan)
    [item] = plan.items.all()
    assert (plan.state, item.outcome) == ("completed", "compensated"), item.outcome_detail
    assert entities(path)["Globex kickoff"]["observations"] == ["booked for Dec 4", "moved to Friday"]
    assert item.outcome_detail["postcondition"] == (
        "The agent's change is taken back, and the newer change is kept: the undo takes back only what the "
        "agent did.")
    assert plan.execution_summary == "Reversed 1 of 1 action"
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert ("Observations deleted successfully. <span class=\"postcondition\">The agent&#x27;s change is "
            "taken back, and the newer change is kept") in page


def test_restoring_a_file_over_a_persons_newer_edit_overwrites_it_as_signed(
        recorder, dana, admin_user, on_call, approver_user, second_approver, tmp_path, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    world = tmp_path / "world"
    pinned_server("filesystem", world, by=admin_user, name="fs")
    _, token = journal_services.create_agent(name="files-bot", on_behalf_of=dana)
    (world / "brief.md").write_bytes(b"# Brief\n")

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(world / "brief.md"), "content": "# Wrong\n"})

    run_agent(recorder, token, script)
    (world / "brief.md").write_bytes(b"# Wrong\n\nReviewed by priya.\n")
    plan = services.request_plan(run=Run.objects.get(agent__name="files-bot"), requested_by=on_call,
                                 reason="wrong file", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    signed_over(plan, (approver_user, second_approver))
    plan = run_plan(plan)
    [item] = plan.items.all()
    assert (plan.state, item.outcome) == ("completed", "compensated")
    assert (world / "brief.md").read_bytes() == b"# Brief\n"
    assert item.outcome_detail["postcondition"] == (
        "It reads as it did before the agent's call: the newer change is overwritten, as the approvers "
        "signed.")


@pytest.mark.parametrize("relation", [
    {"from": "Globex kickoff", "to": "Ann", "relationType": "is attended by"},  # read the same way
    {"from": "Ann", "to": "Globex kickoff", "relationType": "attends"},  # read another way: it names both
])
def test_an_entity_the_run_created_and_then_related_is_no_conflict_and_both_are_undone(
        recorder, memory, on_call, approver_user, second_approver, relation):
    """Issue 44, finding 3: the run's own later step (relating the new entity) is undone first by the same
    plan; the earlier step is not "changed since by someone"."""
    path, token = memory
    path.write_text(json.dumps({"type": "entity", "name": "Ann", "entityType": "person",
                                "observations": []}) + "\n")
    before = entities(path)

    async def script(client):
        await client.call_tool("memory__create_entities", {"entities": [
            {"name": "Globex kickoff", "entityType": "meeting", "observations": []}]})
        await client.call_tool("memory__create_relations", {"relations": [relation]})

    run_agent(recorder, token, script)
    plan = services.request_plan(run=Run.objects.get(agent__name="notes-bot"), requested_by=on_call,
                                 reason="wrong meeting", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    checks = {i.step.number: (i.check_status, i.check_detail) for i in plan.items.select_related("step")}
    assert {n: status for n, (status, _) in checks.items()} == {1: "ok", 2: "ok"}, checks
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(plan)
    assert plan.execution_summary == "Reversed 2 of 2 actions"
    assert entities(path) == before and "relation" not in path.read_text()
