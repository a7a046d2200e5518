"""Each tool of each pack against its real pinned server (issue 23, item 4): an agent calls it through the
Recorder with the pack in force, on-call asks to undo the run, two approvers sign, the worker runs the plan;
then the server's own state is read to see that exactly the agent's change was taken back, or the plan said
plainly that it could not be, and why."""

import json
import subprocess

import pytest
from django.test import Client

from approver import services, tasks
from approver.models import Plan
from journal import services as journal_services
from journal.models import Run, Step
from journal.undo import declarations
from tests.journal.helpers import run_agent
from tests.journal.test_conformance import command, make_world
from tests.services import needs_node

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import run_plan

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]


@pytest.fixture
def serve(recorder, dana, admin_user, tmp_path, monkeypatch):
    """`serve(kind)`: the pinned server of that kind behind the Recorder, its pack in force, and an agent's
    token; returns (world, token)."""
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)

    def start(kind: str, pack: str):
        world = tmp_path / kind
        make_world(kind, world)
        started = command(kind, world, "")
        if kind == "git":  # commits dated now: git_commit takes no date like the conformance tests' fixed one
            started = started[started.index("env") + 3:]
        server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
            name={"filesystem": "files"}.get(kind, kind), command=" ".join(started)))
        services.use_pack(server=server, pack=pack, by=admin_user)
        return world, journal_services.create_agent(name=f"{kind}-bot", on_behalf_of=dana)[1]

    return start


def undo(recorder, token, script, on_call, approvers) -> Plan:
    """Run the agent's script, then undo what it did (from its first call: the agent's run may hold earlier
    calls) with the plan signed by both approvers."""
    done = Step.objects.filter(run__agent__isnull=False).count()
    run_agent(recorder, token, script)
    run = Run.objects.filter(agent__isnull=False).order_by("-started_at").first()
    first = run.steps.count() - (Step.objects.filter(run__agent__isnull=False).count() - done) + 1
    plan = services.request_plan(run=run, requested_by=on_call, reason="undo", from_step=first)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    if plan.items.filter(action="compensate").exists():
        for user in approvers:
            approve(plan, user, enrolled(user), choices={})
        plan = run_plan(plan)
    return plan


def items(plan: Plan) -> dict[int, object]:
    """The plan's items by the script's own call numbers (1 for its first call)."""
    found = {item.step.number: item for item in plan.items.select_related("step")}
    return {number - min(found) + 1: item for number, item in found.items()}


# -- server-filesystem --------------------------------------------------------------------------------------


def test_move_file_is_moved_back(recorder, serve, on_call, approver_user, second_approver):
    world, token = serve("filesystem", "filesystem")

    async def script(client):
        await client.call_tool("files__move_file", {"source": str(world / "notes.txt"),
                                                     "destination": str(world / "sub" / "moved.txt")})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    assert items(plan)[1].outcome == "compensated"
    assert (world / "notes.txt").read_text() == "first line\nsecond line\n"
    assert not (world / "sub" / "moved.txt").exists()


def test_edit_file_puts_crlf_line_endings_back(recorder, serve, on_call, approver_user, second_approver):
    world, token = serve("filesystem", "filesystem")
    (world / "crlf.txt").write_bytes(b"alpha\r\nbeta\r\n")

    async def script(client):
        await client.call_tool("files__edit_file", {"path": str(world / "crlf.txt"),
                                                     "edits": [{"oldText": "beta", "newText": "gamma"}]})

    assert (world / "crlf.txt").exists()
    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    assert items(plan)[1].outcome == "compensated"
    assert (world / "crlf.txt").read_bytes() == b"alpha\r\nbeta\r\n"


def test_a_new_file_a_directory_and_a_binary_file_cannot_be_undone_and_say_why(
        recorder, serve, on_call, approver_user, second_approver):
    world, token = serve("filesystem", "filesystem")

    async def script(client):
        await client.call_tool("files__write_file", {"path": str(world / "new.txt"), "content": "new"})
        await client.call_tool("files__create_directory", {"path": str(world / "made")})
        await client.call_tool("files__write_file", {"path": str(world / "pixel.png"), "content": "text"})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    found = items(plan)
    assert {n: i.action for n, i in found.items()} == {1: "cannot_undo", 2: "cannot_undo", 3: "cannot_undo"}
    assert "did not exist before this call" in found[1].reason
    assert "Delete the file by hand" in found[1].remedy
    assert "cannot delete directories" in found[2].reason
    assert "Remove the directory by hand" in found[2].remedy
    assert "was not valid text" in found[3].reason and "backup" in found[3].remedy
    assert (world / "new.txt").exists() and (world / "made").is_dir()  # nothing was touched


# -- server-memory ------------------------------------------------------------------------------------------


def graph(world) -> dict:
    """The knowledge graph as the memory server keeps it on disk."""
    entities, relations = {}, set()
    for line in (world / "memory.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "entity":
            entities[record["name"]] = sorted(record["observations"])
        else:
            relations.add((record["from"], record["relationType"], record["to"]))
    return {"entities": entities, "relations": relations}


def seed(recorder, token):
    """What was in the graph before the agent's run, put there by the same server (a run undone apart)."""
    async def script(client):
        await client.call_tool("memory__create_entities", {"entities": [
            {"name": "Ann", "entityType": "person", "observations": ["likes tea"]},
            {"name": "Acme", "entityType": "company", "observations": []}]})
        await client.call_tool("memory__create_relations", {"relations": [
            {"from": "Ann", "to": "Acme", "relationType": "works_at"}]})
    run_agent(recorder, token, script)


def test_create_entities_deletes_only_what_the_call_created(recorder, serve, on_call, approver_user,
                                                             second_approver):
    world, token = serve("memory", "memory")
    seed(recorder, token)
    before = graph(world)

    async def script(client):
        await client.call_tool("memory__create_entities", {"entities": [
            {"name": "Ann", "entityType": "person", "observations": ["a duplicate, skipped"]},
            {"name": "Bob", "entityType": "person", "observations": ["new"]}]})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    item = items(plan)[1]
    assert item.arguments == {"entityNames": ["Bob"]} and item.outcome == "compensated"
    assert graph(world) == before  # Ann, who was there before, survives


def test_create_relations_and_add_observations_take_back_exactly_what_they_added(
        recorder, serve, on_call, approver_user, second_approver):
    world, token = serve("memory", "memory")
    seed(recorder, token)
    before = graph(world)

    async def script(client):
        await client.call_tool("memory__create_relations", {"relations": [
            {"from": "Ann", "to": "Acme", "relationType": "works_at"},  # there already: skipped
            {"from": "Acme", "to": "Ann", "relationType": "employs"}]})
        await client.call_tool("memory__add_observations", {"observations": [
            {"entityName": "Ann", "contents": ["likes tea", "on call this week"]}]})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    found = items(plan)
    assert found[1].arguments == {"relations": [{"from": "Acme", "to": "Ann", "relationType": "employs"}]}
    assert found[2].arguments == {"deletions": [{"entityName": "Ann", "observations": ["on call this week"]}]}
    assert {n: i.outcome for n, i in found.items()} == {1: "compensated", 2: "compensated"}
    assert graph(world) == before


def test_deleted_observations_and_relations_are_put_back(recorder, serve, on_call, approver_user,
                                                         second_approver):
    world, token = serve("memory", "memory")
    seed(recorder, token)
    before = graph(world)

    async def script(client):
        await client.call_tool("memory__delete_observations", {"deletions": [
            {"entityName": "Ann", "observations": ["likes tea"]}]})
        await client.call_tool("memory__delete_relations", {"relations": [
            {"from": "Ann", "to": "Acme", "relationType": "works_at"}]})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    assert {n: i.outcome for n, i in items(plan).items()} == {1: "compensated", 2: "compensated"}
    assert graph(world) == before


def test_deleted_entities_come_back_with_every_relation_the_delete_took(recorder, serve, on_call,
                                                                         approver_user, second_approver):
    """Two calls, signed as one item: the entities first, then the relations they had."""
    world, token = serve("memory", "memory")
    seed(recorder, token)
    before = graph(world)

    async def script(client):
        await client.call_tool("memory__delete_entities", {"entityNames": ["Ann"]})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    item = items(plan)[1]
    assert item.tool == "create_entities" and item.arguments == {"entities": [
        {"name": "Ann", "entityType": "person", "observations": ["likes tea"]}]}
    assert item.then == [{"tool": "create_relations", "arguments": {"relations": [
        {"from": "Ann", "to": "Acme", "relationType": "works_at"}]}}]
    assert services.plan_content(plan)["items"][0]["compensation"]["then"] == item.then  # signed
    web = Client()
    web.force_login(approver_user)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert ", then create_relations {relations: [{&quot;from&quot;: &quot;Ann&quot;" in page
    assert item.outcome == "compensated", item.outcome_detail
    assert graph(world) == before
    calls = list(plan.compensation_run.steps.order_by("number").values_list("tool", "request_meta"))
    assert [tool for tool, _ in calls] == ["create_entities", "create_relations"]
    keys = [meta[declarations.HATP_KEY]["idempotencyKey"] for _, meta in calls]
    assert keys[1] == f"{keys[0]}.2"


# -- mcp-server-git -----------------------------------------------------------------------------------------


def staged(world) -> str:
    return subprocess.run(["git", "-C", str(world), "diff", "--cached", "--name-only"], check=True,
                          capture_output=True, text=True).stdout


def test_git_add_is_undone_by_a_reset_and_a_commit_cannot_be(recorder, serve, on_call, approver_user,
                                                             second_approver):
    world, token = serve("git", "git")
    (world / "b.txt").write_text("two\n")

    async def script(client):
        await client.call_tool("git__git_add", {"repo_path": str(world), "files": ["b.txt"]})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    item = items(plan)[1]
    assert item.tool == "git_reset" and "unstages everything" in item.side_effect
    assert item.outcome == "compensated" and staged(world) == ""

    async def commits(client):
        await client.call_tool("git__git_add", {"repo_path": str(world), "files": ["b.txt"]})
        await client.call_tool("git__git_commit", {"repo_path": str(world), "message": "second"})

    plan = undo(recorder, token, commits, on_call, ())
    found = items(plan)
    assert found[2].action == "cannot_undo" and "cannot undo a commit" in found[2].reason
    assert "git revert" in found[2].remedy


def test_two_changes_to_one_file_are_undone_in_turn_back_to_the_first(recorder, serve, on_call,
                                                                      approver_user, second_approver):
    """The first write's check finds the file where the second left it: no conflict, since the second's
    undo runs first and puts it back where the first left it."""
    world, token = serve("filesystem", "filesystem")

    async def script(client):
        await client.call_tool("files__write_file", {"path": str(world / "notes.txt"), "content": "one\n"})
        await client.call_tool("files__edit_file", {"path": str(world / "notes.txt"),
                                                     "edits": [{"oldText": "one", "newText": "two"}]})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    found = items(plan)
    assert found[1].check_status == "ok" and "once the undos of the run's later changes to it have run" in (
        found[1].check_detail["wouldDo"])
    assert {n: i.outcome for n, i in found.items()} == {1: "compensated", 2: "compensated"}
    assert (world / "notes.txt").read_text() == "first line\nsecond line\n"


def branch(world) -> str:
    return subprocess.run(["git", "-C", str(world), "branch", "--show-current"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_git_checkout_goes_back_to_the_branch_checked_out_before(recorder, serve, on_call, approver_user,
                                                                 second_approver):
    world, token = serve("git", "git")
    subprocess.run(["git", "-C", str(world), "branch", "feature"], check=True)

    async def script(client):
        await client.call_tool("git__git_checkout", {"repo_path": str(world), "branch_name": "feature"})

    plan = undo(recorder, token, script, on_call, (approver_user, second_approver))
    item = items(plan)[1]
    assert item.arguments == {"repo_path": str(world), "branch_name": "main"}
    assert item.outcome == "compensated" and branch(world) == "main"


def test_a_checkout_from_a_detached_head_cannot_be_undone_and_says_why(recorder, serve, on_call):
    world, token = serve("git", "git")
    subprocess.run(["git", "-C", str(world), "checkout", "-q", "--detach"], check=True)

    async def script(client):
        await client.call_tool("git__git_checkout", {"repo_path": str(world), "branch_name": "main"})

    plan = undo(recorder, token, script, on_call, ())
    item = items(plan)[1]
    assert item.action == "cannot_undo" and "does not match" in item.reason


def test_an_edit_of_a_file_that_is_not_there_is_not_called_a_creation(recorder, serve):
    """Issue 44, finding 8: an edit_file of a missing file was explained as "The file did not exist before
    this call, which created it"; it creates nothing (the server refuses), so nothing is held or undone."""
    world, token = serve("filesystem", "filesystem")

    async def script(client):
        return await client.call_tool("files__edit_file", {"path": str(world / "missing.md"),
                                                           "edits": [{"oldText": "a", "newText": "b"}]})

    result = run_agent(recorder, token, script)
    assert result.is_error and not (world / "missing.md").exists()
    step = Step.objects.get(tool="edit_file")
    assert step.declaration["kind"] == "read_only" and "created it" not in step.declaration["reason"]
    assert "editing a file that does not exist changes nothing" in step.declaration["reason"]
    assert step.policy_decision["decision"] == "allow"
