"""The tool servers' pages, for admins (issue 23, item 5): where each tool's undo comes from, a pack put in
force, a recipe written with a preview against a past call and refused with the reason when it does not fit,
every change logged (who, when, before and after). With the real pinned filesystem server."""

import json

import pytest
from django.test import Client

from approver import services
from approver.models import PolicyChange
from journal import services as journal_services
from journal.models import ToolServer
from journal.undo import packs, recipes
from tests.journal.helpers import run_agent
from tests.journal.test_conformance import command, make_world
from tests.services import needs_node

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]


@pytest.fixture
def fs(tmp_path):
    world = tmp_path / "world"
    make_world("filesystem", world)
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=" ".join(command("filesystem", world, ""))))
    return server, world


@pytest.fixture
def admin(admin_user):
    web = Client()
    web.force_login(admin_user)
    return web


def page(response) -> str:
    return response.content.decode()


def test_an_admin_sees_where_each_tools_undo_comes_from_and_puts_a_pack_in_force(fs, admin):
    server, _ = fs
    listing = page(admin.get("/servers/"))
    assert f'href="/servers/{server.pk}/">fs</a>' in listing
    before = page(admin.get(f"/servers/{server.pk}/"))
    assert "its server says nothing about undoing it, and it has no recipe" in before
    assert "its server says it only reads (readOnlyHint)" in before  # read_text_file
    # Issue 44, finding 12: the kinds in words, not the code's names.
    assert ">Only reads: nothing to undo</td>" in before and ">read_only</td>" not in before
    assert ">Not known</td>" in before and ">unknown</td>" not in before

    response = admin.post(f"/servers/{server.pk}/pack/", {"pack": "filesystem", "needs_human": "on"},
                          follow=True)
    shown = page(response)
    assert "The filesystem pack is in force on fs for 4 tools." in shown
    assert "an admin&#x27;s recipe: restore the file&#x27;s earlier content, byte for byte" in shown
    assert "The <strong>filesystem</strong> pack is in force, set by ada on" in shown
    server.refresh_from_db()
    assert all(r.get("needsHuman", True) for r in server.recipes)
    change = PolicyChange.objects.get(event="recipes_changed")
    assert change.data["by"] == "ada" and change.data["before"]["recipes"] == []
    assert change.data["after"]["pack"] == "filesystem"
    assert f'id="change-{change.seq}" title="Entry {change.seq} of the change log"' in shown  # its own log
    # Removing a recipe is not one click away: it says what removing does, behind its own button.
    assert ">Undone by a compensation</td>" in shown
    assert "<summary>Remove its recipe…</summary>" in shown and ">Remove</button>" not in shown
    assert "will then be as undoable as fs says it is (the change is logged)." in shown


def test_an_admin_may_let_a_packs_undos_run_under_the_plan_policies(fs, admin):
    server, _ = fs
    admin.post(f"/servers/{server.pk}/pack/", {"pack": "filesystem"})  # the box unticked
    server.refresh_from_db()
    undoing = [r for r in server.recipes if r["kind"] == "compensate"]
    assert undoing and all(r["needsHuman"] is False for r in undoing)
    declared = recipes.declaration_for(server.tool("write_file"), catalogue=server.tool_names,
                                       recipe=server.recipe("write_file"), listing=server.catalogue)
    assert declared.kind == "compensate" and not declared.needs_human


def test_a_recipe_is_previewed_against_the_tools_last_call_then_saved(fs, admin, recorder, dana):
    server, world = fs
    token = journal_services.create_agent(name="files-bot", on_behalf_of=dana)[1]

    async def script(client):
        await client.call_tool("fs__move_file", {"source": str(world / "a.txt"), "destination":
                                                 str(world / "b.txt")})

    (world / "a.txt").write_text("a")
    run_agent(recorder, token, script)
    recipe = next(r for r in packs.pack("filesystem") if r["tool"] == "move_file")
    editor = page(admin.get(f"/servers/{server.pk}/?tool=move_file"))
    assert recipes.schema_digest(server.tool("move_file")) in editor  # the skeleton carries the digest

    shown = page(admin.post(f"/servers/{server.pk}/recipe/", {"recipe": json.dumps(recipe), "preview": ""}))
    assert "For <a href=" in shown and "step 1</a>" in shown
    assert (f"move_file {{source: &quot;{world / 'b.txt'}&quot;, destination: &quot;{world / 'a.txt'}&quot;}}"
            in shown)
    server.refresh_from_db()
    assert server.recipes == []  # a preview changes nothing

    saved = admin.post(f"/servers/{server.pk}/recipe/", {"recipe": json.dumps(recipe), "save": ""},
                       follow=True)
    assert "The recipe for move_file is in force on fs." in page(saved)
    server.refresh_from_db()
    assert [r["tool"] for r in server.recipes] == ["move_file"] and server.recipe_pack == ""
    assert "an admin&#x27;s recipe: move it back to where it was" in page(saved)

    removed = admin.post(f"/servers/{server.pk}/recipe/remove/", {"tool": "move_file"}, follow=True)
    assert "The recipe for move_file is removed" in page(removed)
    server.refresh_from_db()
    assert server.recipes == [] and PolicyChange.objects.filter(event="recipes_changed").count() == 2


def test_a_preview_reads_the_earlier_state_the_recorder_kept(fs, admin, recorder, dana, admin_user):
    server, world = fs
    services.use_pack(server=server, pack="filesystem", by=admin_user)
    token = journal_services.create_agent(name="files-bot", on_behalf_of=dana)[1]
    (world / "a.txt").write_text("x" * 1500)

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(world / "a.txt"), "content": "agent"})

    run_agent(recorder, token, script)
    recipe = server.recipe("write_file")
    shown = page(admin.post(f"/servers/{server.pk}/recipe/", {"recipe": json.dumps(recipe), "preview": ""}))
    assert f"write_file {{path: &quot;{world / 'a.txt'}&quot;, content: 1.5 kB}}" in shown


@pytest.mark.parametrize(("recipe", "reason"), [
    ("{not json", "This is not JSON"),
    ("[1, 2]", "A recipe is one JSON object"),
    (json.dumps({"tool": "delete_file", "schemaDigest": "0" * 64, "kind": "none"}),
     "the server lists no tool &#x27;delete_file&#x27;"),
    (json.dumps({"tool": "move_file", "schemaDigest": "0" * 64, "kind": "compensate",
                 "compensation": {"tool": "move_file", "arguments": {"source": "$request.body#/target"}}}),
     "move_file declares no argument &#x27;target&#x27;"),
    (json.dumps({"tool": "write_file", "schemaDigest": "0" * 64, "kind": "compensate",
                 "read": {"tool": "read_text_file", "arguments": {"path": "$request.body#/path"}},
                 "compensation": {"tool": "write_file", "arguments": {"path": "$request.body#/path",
                                                                      "content": "$before.body#/text"}}}),
     "read_text_file&#x27;s result declares no field &#x27;text&#x27;"),
    (json.dumps({"tool": "move_file", "schemaDigest": "0" * 64, "kind": "compensate",
                 "compensation": {"tool": "rm", "arguments": {}}}),
     "the compensation tool &#x27;rm&#x27; is not a tool of this server"),
])
def test_a_recipe_that_does_not_fit_is_refused_with_the_reason_and_nothing_changes(fs, admin, recipe, reason):
    server, _ = fs
    for button in ("save", "preview"):
        response = admin.post(f"/servers/{server.pk}/recipe/", {"recipe": recipe, button: ""})
        assert response.status_code == 400 and reason in page(response)
    assert ToolServer.objects.get(pk=server.pk).recipes == []
    assert not PolicyChange.objects.exists()
