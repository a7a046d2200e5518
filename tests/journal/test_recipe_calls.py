"""Calls to a server that declares nothing, journaled under an admin's recipe (issue 23), through the real
Recorder and the real pinned filesystem server: the recipe decides the step's undo, the compensation is
bound from the call, and a tool the recipe says cannot be undone says why and what to do instead."""

import sys
from pathlib import Path

import pytest
from django.test import Client

from journal import services as journal_services
from journal.models import Step, ToolServer
from journal.record import bundle
from journal.undo import packs, recipes

from ..services import needs_node
from .helpers import run_agent
from .test_conformance import command, make_world

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]


@pytest.fixture
def fs_token(recorder, dana, tmp_path):
    world = tmp_path / "world"
    make_world("filesystem", world)
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=" ".join(command("filesystem", world, ""))))
    journal_services.set_recipes(server=server, raw=packs.pack("filesystem"), pack="filesystem", by="ada")
    return world, journal_services.create_agent(name="files-bot", on_behalf_of=dana)[1]


def test_a_recipe_decides_the_undo_of_a_call_its_server_says_nothing_about(recorder, fs_token):
    world, token = fs_token

    async def script(client):
        await client.call_tool("fs__move_file", {"source": str(world / "notes.txt"),
                                                 "destination": str(world / "moved.txt")})
        await client.call_tool("fs__create_directory", {"path": str(world / "new-dir")})

    run_agent(recorder, token, script)
    moved, made = Step.objects.order_by("number")
    assert (world / "moved.txt").exists() and (world / "new-dir").is_dir()
    assert moved.declaration_source == "recipe" and moved.reversibility == "compensate"
    assert moved.declaration["needs_human"] is True
    assert moved.compensation_arguments == {"source": str(world / "moved.txt"),
                                            "destination": str(world / "notes.txt")}
    assert made.declaration_source == "recipe" and made.reversibility == "none"
    assert "cannot delete directories" in made.declaration["reason"]
    assert "Remove the directory by hand" in made.declaration["remedy"]


def test_without_the_recipe_the_same_call_is_unknown(recorder, fs_token):
    world, token = fs_token
    journal_services.set_recipes(server=ToolServer.objects.get(name="fs"), raw=[], pack="", by="ada")

    async def script(client):
        await client.call_tool("fs__create_directory", {"path": str(world / "new-dir")})

    run_agent(recorder, token, script)
    step = Step.objects.get()
    assert step.reversibility == "unknown" and step.declaration_source == "none"


def test_the_recorder_keeps_the_earlier_state_and_binds_the_undo_to_it(recorder, fs_token, on_call):
    world, token = fs_token
    crlf = world / "crlf.txt"
    crlf.write_bytes(b"first line\r\nsecond line\r\n")

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(crlf), "content": "rewritten by the agent\n"})
        await client.call_tool("fs__write_file", {"path": str(world / "new.txt"), "content": "new\n"})
        await client.call_tool("fs__edit_file", {"path": str(world / "notes.txt"), "dryRun": True,
                                                 "edits": [{"oldText": "first", "newText": "1st"}]})

    run_agent(recorder, token, script)
    rewritten, created, previewed = Step.objects.order_by("number")
    assert crlf.read_bytes() == b"rewritten by the agent\n"
    # What was there, read just before the call, is what the undo writes back, byte for byte.
    assert rewritten.earlier_state["tool"] == "read_text_file"
    assert rewritten.earlier_state["structured"] == {"content": "first line\r\nsecond line\r\n"}
    assert rewritten.reversibility == "compensate" and rewritten.undo_problems == []
    assert rewritten.compensation_arguments == {"path": str(crlf), "content": "first line\r\nsecond line\r\n"}
    assert rewritten.effect_version.startswith("sha256:")
    assert rewritten.effect_version != rewritten.earlier_state["version"]
    entries = list(rewritten.run.entries.order_by("seq").values_list("event", "data"))
    call_at = next(i for i, (event, data) in enumerate(entries) if event == "call" and data["step"] == 1)
    assert entries[call_at + 1][0] == "earlier_state"
    assert entries[call_at + 1][1]["version"] == rewritten.earlier_state["version"]
    # What was read is on the record, exported with the run, and so is what was read just after the call.
    assert entries[call_at + 1][1]["structured"] == {"content": "first line\r\nsecond line\r\n"}
    result = next(data for event, data in entries if event == "result" and data["step"] == 1)
    assert result["readAfter"] == {"content": "rewritten by the agent\n"}
    assert rewritten.earlier_state["left"] == {"content": "rewritten by the agent\n"}
    exported = journal_services.export_bundle(run=rewritten.run)
    imported = bundle.step_fields(exported["entries"], started_at=rewritten.run.started_at)
    assert imported[0]["earlier_state"] == rewritten.earlier_state
    # Shown to whoever may read the run's results: on its page, linked to the call, and in the API.
    web = Client()
    web.force_login(on_call)
    page = web.get(f"/runs/{rewritten.run.public_id}/").content.decode()
    assert 'id="read-1"' in page and "The Recorder read the record just before the call" in page
    assert "just before the call and again just after, so the undo can put it back" in page
    assert "rewritten by the agent" in page
    assert "The Recorder could not read the record before the call, for its undo" in page  # ENOENT
    api = web.get(f"/api/runs/{rewritten.run.public_id}/steps/").json()
    assert api["items"][0]["earlierState"]["left"] == {"content": "rewritten by the agent\n"}

    assert created.reversibility == "none"
    assert "did not exist before this call" in created.declaration["reason"]
    assert "ENOENT" in created.earlier_state["error"]
    assert previewed.undo_problems == ["nothing to undo: the call left the record as it found it"]
    assert journal_services.verify_run(run=rewritten.run).ok


def test_a_recipe_put_in_force_or_taken_off_between_two_calls_applies_from_the_next(recorder, fs_token):
    """The Recorder reads the record first by the server as it last knew it (one trip to the journal); when
    an admin changed the recipes since, the journal says so and the call goes by the recipes in force."""
    world, token = fs_token
    server = ToolServer.objects.get(name="fs")
    path = str(world / "notes.txt")

    async def write(client):
        await client.call_tool("fs__write_file", {"path": path, "content": "agent\n"})

    run_agent(recorder, token, write)  # the Recorder now knows fs with its recipes
    journal_services.set_recipes(server=server, raw=[], pack="", by="ada")
    run_agent(recorder, token, write)
    journal_services.set_recipes(server=server, raw=packs.pack("filesystem"), pack="filesystem", by="ada")
    run_agent(recorder, token, write)
    first, off, on_again = Step.objects.order_by("started_at")
    assert first.reversibility == "compensate" and first.earlier_state["version"]
    assert off.reversibility == "unknown" and off.earlier_state is None  # what it read first is not kept
    assert on_again.reversibility == "compensate" and on_again.earlier_state["structured"] == {
        "content": "agent\n"}


@pytest.mark.parametrize(("read", "kind", "said"), [
    ("peek", "unknown", "nested 5003 levels deep, deeper than the Recorder's limit"),
    ("heap", "none", "bytes, over the 65536 kept, so it cannot be put back."),
])
def test_a_hostile_answer_to_the_earlier_state_read_is_bounded_and_the_step_says_why(recorder, dana, read,
                                                                                    kind, said):
    """A read that answers deeper or larger than the Recorder keeps: nothing of it is kept, the policy
    decides on what that leaves (unknown, or cannot be undone), and the step says why."""
    deep = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "deep_stdio_server.py")]
    server = journal_services.refresh_catalogue(
        server=journal_services.register_tool_server(name="deep", command=" ".join(deep)))
    recipe = {"tool": "poke", "schemaDigest": recipes.schema_digest(server.tool("poke")),
              "kind": "compensate", "read": {"tool": read, "arguments": {}},
              "compensation": {"tool": "poke", "arguments": {}}}
    journal_services.set_recipes(server=server, raw=[recipe], pack="", by="ada")
    token = journal_services.create_agent(name="bot", on_behalf_of=dana)[1]

    async def script(client):
        return await client.call_tool("deep__poke", {})

    assert not run_agent(recorder, token, script).is_error
    step = Step.objects.get(tool="poke")
    assert step.reversibility == kind and "structured" not in step.earlier_state
    assert said in (step.declaration["reason"] or "") + " ".join(step.undo_problems)
    assert step.compensation_arguments is None and journal_services.verify_run(run=step.run).ok


def test_a_recipes_pattern_runs_in_linear_time_on_what_the_agent_wrote(recorder, fs_token):
    """Issue 43, finding 8: an admin's pattern that backtracks in Python's `re` (`^(\\w+\\s?)*$`), run by the
    Recorder on a file the agent wrote (30 words and a '!'): `re` took seconds per call, doubling with every
    word; RE2 answers at once, and the step is journaled as the recipe says."""
    world, token = fs_token
    server = ToolServer.objects.get(name="fs")
    pack = packs.pack("filesystem")
    for recipe in pack:
        if recipe["tool"] == "write_file":
            recipe["refuseIfBefore"]["matches"] = r"^(\w+\s?)*$"
    journal_services.set_recipes(server=server, raw=pack, pack="", by="ada")
    hostile = " ".join(["word"] * 30) + "!"
    path = str(world / "hostile.txt")

    async def script(client):
        import time

        await client.call_tool("fs__write_file", {"path": path, "content": hostile})
        started = time.monotonic()
        await client.call_tool("fs__write_file", {"path": path, "content": "plain words"})
        return time.monotonic() - started

    seconds = run_agent(recorder, token, script)
    assert seconds < 5, f"the second write took {seconds:.1f} s"
    second = Step.objects.filter(tool="write_file").order_by("number").last()
    assert second.earlier_state["structured"] == {"content": hostile}
    assert second.reversibility == "compensate"  # the pattern does not match: the file can be put back
    assert (world / "hostile.txt").read_text() == "plain words"
