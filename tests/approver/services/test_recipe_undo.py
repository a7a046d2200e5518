"""Undoing calls to a server that declares nothing, by an admin's recipe (issue 23), end to end with the real
pinned filesystem server: the Recorder kept each file's earlier state; the plan's checks read each file
again (as the agent left it: would undo; as it was: undone already; else a conflict); two approvers sign,
keeping the newer change a person made by hand; the worker writes the earlier bytes back, byte for byte, and
counts an undo only once the file reads as it did before the call."""

import json

import pytest
from django.test import Client

from approver import services, tasks
from approver.models import PlanItem
from journal import services as journal_services
from journal.models import Run, Step
from tests.journal.helpers import run_agent
from tests.journal.test_conformance import command, make_world
from tests.services import needs_node

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import run_plan
from .test_held_calls import call, decide, held, in_background, set_policy

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]


def pinned_server(kind: str, world, *, by, name: str = ""):
    """The pinned official server of `kind` over `world` (made first), registered under `name` (default:
    the kind's short name) with its recipe pack in force, put there by `by`."""
    make_world(kind, world)
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name=name or {"filesystem": "fs"}.get(kind, kind), command=" ".join(command(kind, world, ""))))
    services.use_pack(server=server, pack=kind, by=by)
    return server


@pytest.fixture
def files(recorder, dana, admin_user, tmp_path, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    world = tmp_path / "world"
    make_world("filesystem", world)
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=" ".join(command("filesystem", world, ""))))
    services.use_pack(server=server, pack="filesystem", by=admin_user)
    return world, journal_services.create_agent(name="files-bot", on_behalf_of=dana)[1]


def test_an_agents_file_writes_are_undone_byte_for_byte_and_a_persons_later_edit_is_kept(
        recorder, files, on_call, approver_user, second_approver):
    world, token = files
    (world / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (world / "report.md").write_bytes(b"# Report\n\nDraft.\n")

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(world / "crlf.txt"), "content": "replaced\n"})
        await client.call_tool("fs__edit_file", {"path": str(world / "report.md"),
                                                 "edits": [{"oldText": "Draft.", "newText": "Final."}]})
        await client.call_tool("fs__write_file", {"path": str(world / "new.txt"), "content": "new\n"})

    run_agent(recorder, token, script)
    run = Run.objects.get(agent__name="files-bot")
    (world / "report.md").write_bytes(b"# Report\n\nFinal, reviewed by priya.\n")  # a person, afterwards

    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong files", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    items = {i.step.number: i for i in plan.items.select_related("step")}
    assert items[3].action == "cannot_undo" and "did not exist before this call" in items[3].reason
    assert items[1].check_status == "ok" and items[1].tool == "write_file"
    assert items[1].arguments == {"path": str(world / "crlf.txt"), "content": "one\r\ntwo\r\n"}
    assert "restore the file's earlier content" in items[1].check_detail["wouldDo"].lower()
    assert items[2].check_status == "conflict" and "Changed since the agent's call" in (
        items[2].check_detail["message"])
    assert items[1].needs_human  # a recipe's undo: a person signs, whatever the policies say
    # The record each undo changes, as leases name it: a filesystem has no resource, so the recipe's read.
    assert items[1].record.startswith("read_text_file {") and str(world / "crlf.txt") in items[1].record
    web = Client()
    web.force_login(on_call)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    # Honest where nothing is known: the new file has no version to compare.
    assert "For step 3 there is no version to compare, so whether it changed since cannot be told." in page
    assert "Nothing changed since the agent acted" not in page
    # The conflict, three ways: what the agent changed, and what a person changed since.
    three = items[2].check_detail["threeWay"]["text"]
    assert "-Draft." in three["agent"] and "+Final." in three["agent"]
    assert "-Final." in three["since"] and "+Final, reviewed by priya." in three["since"]
    assert "What the agent changed:" in page and "+Final, reviewed by priya." in page
    # The recipe behind each undo, and the call it makes, in one line.
    assert ("By an admin's recipe: restore the file&#x27;s earlier content, byte for byte "
            "(the filesystem pack") \
        in page
    assert f'It will call <code>write_file {{path: &quot;{world / "crlf.txt"}&quot;, content: 10 B}}</code>' \
        in page
    assert "a change in the moment between that read and the write could be overwritten" in page

    conflict = str(items[2].position)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={conflict: "keep_newer"})
    plan.refresh_from_db()
    assert plan.state == "approved"
    # It holds the file it will write back; the one whose newer change it keeps, it leaves to others.
    assert list(plan.leases.held().values_list("resource", flat=True)) == [items[1].record]
    plan = run_plan(plan)
    outcomes = {i.step.number: i.outcome for i in plan.items.select_related("step")}
    assert outcomes == {1: "compensated", 2: "skipped", 3: "irreversible"}
    assert (world / "crlf.txt").read_bytes() == b"one\r\ntwo\r\n"  # the CRLF line endings included
    assert (world / "report.md").read_bytes() == b"# Report\n\nFinal, reviewed by priya.\n"
    assert (world / "new.txt").exists()  # this server cannot delete: left, and said so
    done = plan.items.get(step__number=1)
    assert done.outcome_detail["postcondition"] == "It reads as it did before the call."
    assert plan.state == "partially_completed"  # the person's change was kept, as the approvers chose
    assert plan.execution_summary == "Reversed 1 of 2 actions; 1 skipped; 1 cannot be undone"


def test_an_undo_finds_the_file_changed_since_the_check_and_leaves_it_alone(
        recorder, files, on_call, approver_user, second_approver):
    world, token = files
    (world / "a.txt").write_text("before\n")

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(world / "a.txt"), "content": "agent\n"})

    run_agent(recorder, token, script)
    run = Run.objects.get(agent__name="files-bot")
    plan = services.request_plan(run=run, requested_by=on_call, reason="undo", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    (world / "a.txt").write_text("a person, after the check\n")  # no conditional write: read just before
    plan = run_plan(plan)
    item = plan.items.get()
    assert item.outcome == "conflict" and item.call_step_id is None  # nothing was sent
    assert (world / "a.txt").read_text() == "a person, after the check\n"
    assert PlanItem.objects.filter(outcome="compensated").count() == 0


def test_the_whole_story_files_and_a_knowledge_graph_undone_a_persons_edit_kept(
        recorder, files, on_call, approver_user, second_approver, admin_user, tmp_path):
    """Issue 23's 'done when': overwrite and edit files (one CRLF), move one, create one; create entities
    (one there already) and add observations; a person edits a file; undo from step 1."""
    world, token = files
    graph = tmp_path / "graph"
    make_world("memory", graph)
    (graph / "memory.jsonl").write_text(json.dumps(
        {"type": "entity", "name": "Ann", "entityType": "person", "observations": ["likes tea"]}) + "\n")
    memory = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="memory", command=" ".join(command("memory", graph, ""))))
    services.use_pack(server=memory, pack="memory", by=admin_user)
    (world / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (world / "report.md").write_bytes(b"# Report\n\nDraft.\n")
    (world / "plan.md").write_bytes(b"plan\n")
    graph_before = (graph / "memory.jsonl").read_text()

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(world / "crlf.txt"), "content": "replaced\n"})
        await client.call_tool("fs__edit_file", {"path": str(world / "report.md"),
                                                 "edits": [{"oldText": "Draft.", "newText": "Final."}]})
        await client.call_tool("fs__move_file", {"source": str(world / "plan.md"),
                                                 "destination": str(world / "sub" / "plan.md")})
        await client.call_tool("fs__write_file", {"path": str(world / "new.txt"), "content": "new\n"})
        await client.call_tool("memory__create_entities", {"entities": [
            {"name": "Ann", "entityType": "person", "observations": ["the agent's Ann"]},
            {"name": "Bob", "entityType": "person", "observations": ["met at the fair"]}]})
        await client.call_tool("memory__add_observations", {"observations": [
            {"entityName": "Ann", "contents": ["prefers email"]}]})

    run_agent(recorder, token, script)
    run = Run.objects.get(agent__name="files-bot")
    # The policies class a recipe call by whether its read took a version: moving a file has none to take.
    classes = dict(run.steps.values_list("number", "policy_decision__class"))
    assert classes == {1: "compensate_api", 2: "compensate_api", 3: "compensate_no_version", 4: "none",
                       5: "compensate_api", 6: "compensate_api"}
    (world / "report.md").write_bytes(b"# Report\n\nFinal, reviewed by priya.\n")  # a person, afterwards

    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong files", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    items = {i.step.number: i for i in plan.items.select_related("step")}
    assert {n: (i.action, i.check_status) for n, i in items.items()} == {
        1: ("compensate", "ok"), 2: ("compensate", "conflict"), 3: ("compensate", "ok"),
        4: ("cannot_undo", ""), 5: ("compensate", "ok"), 6: ("compensate", "ok")}
    assert items[5].arguments == {"entityNames": ["Bob"]}  # Ann was there already: she stays
    # Ann reads differently now, as step 6 left her; its undo runs first, and step 5's reads again.
    assert "just before it runs it is read again" in items[5].check_detail["wouldDo"]
    assert items[6].arguments == {"deletions": [{"entityName": "Ann", "observations": ["prefers email"]}]}
    web = Client()
    web.force_login(approver_user)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert "did not exist before this call" in page and "+Final, reviewed by priya." in page

    conflict = str(items[2].position)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={conflict: "keep_newer"})
    plan = run_plan(plan)
    outcomes = {i.step.number: i.outcome for i in plan.items.select_related("step")}
    assert outcomes == {1: "compensated", 2: "skipped", 3: "compensated", 4: "irreversible",
                        5: "compensated", 6: "compensated"}
    assert (world / "crlf.txt").read_bytes() == b"one\r\ntwo\r\n"
    assert (world / "report.md").read_bytes() == b"# Report\n\nFinal, reviewed by priya.\n"
    assert (world / "plan.md").read_bytes() == b"plan\n" and not (world / "sub" / "plan.md").exists()
    assert (world / "new.txt").exists()
    assert sorted(map(json.loads, (graph / "memory.jsonl").read_text().splitlines()),
                  key=lambda r: r["name"]) == [json.loads(graph_before)]
    assert plan.execution_summary == "Reversed 4 of 5 actions; 1 skipped; 1 cannot be undone"
    report = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert "Reversed 4 of 5 actions; 1 skipped; 1 cannot be undone" in report


def test_a_held_call_reads_the_record_again_once_approved(recorder, files, admin_user, approver_user,
                                                          monkeypatch):
    """A call held for approval may wait for hours: the undo puts back what was there when it was sent."""
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    world, token = files
    set_policy(admin_user, compensate_api="ask", compensate_no_version="ask")
    (world / "a.txt").write_text("before\n")
    (world / "b.txt").write_text("before\n")

    def write(name):
        arguments = {"path": str(world / name), "content": "agent\n"}
        return lambda: call(recorder, token, "fs__write_file", arguments)

    thread, box = in_background(write("a.txt"))
    action = held()
    (world / "a.txt").write_text("a person, while it waited\n")
    decide(action, approver_user, "approve")
    thread.join(timeout=30)
    assert not box["result"].is_error and (world / "a.txt").read_text() == "agent\n"
    step = Step.objects.get(tool="write_file", arguments__path=str(world / "a.txt"))
    assert step.earlier_state["structured"] == {"content": "a person, while it waited\n"}
    assert step.compensation_arguments["content"] == "a person, while it waited\n"
    reads = list(step.run.entries.filter(event="earlier_state").values_list("data", flat=True))
    assert [r["structured"]["content"] for r in reads] == ["before\n", "a person, while it waited\n"]
    assert reads[1]["again"] is True and journal_services.verify_run(run=step.run).ok

    # The file went away while the call waited: the approval was for an undoable write, so nothing is sent.
    thread, box = in_background(write("b.txt"))
    action = held()
    (world / "b.txt").unlink()
    decide(action, approver_user, "approve")
    thread.join(timeout=30)
    assert box["result"].is_error and "could no longer be read as the undo of this call needs" in (
        box["result"].content[0].text)
    assert not (world / "b.txt").exists()
