"""Admins put undo recipes in force for the servers that declare nothing (issue 23): a pack for the real
pinned filesystem server, from the command line or when registering it; a recipe of their own, refused with
the reason when it does not fit; every change in the policies' signed change log."""

import io

import pytest
from django.core.management import call_command

from approver import services
from approver.models import PolicyChange
from journal import services as journal_services
from journal.models import ToolServer
from tests.journal.test_conformance import command, make_world
from tests.services import needs_node

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]


@pytest.fixture
def filesystem(tmp_path):
    make_world("filesystem", tmp_path / "world")
    return " ".join(command("filesystem", tmp_path / "world", ""))


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=out, **options)
    return out.getvalue()


def test_registering_a_server_with_a_pack_puts_its_recipes_in_force_and_logs_who(filesystem):
    said = run("add_tool_server", "fs", command=filesystem, recipes="filesystem")
    assert "fs: 14 tools" in said and "the filesystem pack is in force for 4 tools" in said
    server = ToolServer.objects.get(name="fs")
    assert server.recipe_pack == "filesystem" and server.recipe("write_file")["kind"] == "compensate"
    assert server.recipes_changed_by.endswith("(command line)")
    [change] = PolicyChange.objects.filter(event="recipes_changed")
    assert change.data["before"] == {"server": "fs", "pack": "", "recipes": []}
    assert [r["tool"] for r in change.data["after"]["recipes"]] == [
        "write_file", "edit_file", "move_file", "create_directory"]
    assert services.verify_policy_log().ok

    listing = run("recipes", "fs")
    assert "the filesystem pack, 4 recipes" in listing
    assert "write_file" in listing and "an admin's recipe: restore the file's earlier content" in listing
    assert "read_text_file               read_only   its server says it only reads" in listing
    assert "create_directory             none" in listing

    run("recipes", "fs", use="filesystem", under_policies=True)  # the admin lets them run under the policies
    assert ToolServer.objects.get(name="fs").recipe("write_file")["needsHuman"] is False
    assert "no recipes" in run("recipes", "fs", off=True)
    assert ToolServer.objects.get(name="fs").recipes == []
    assert PolicyChange.objects.filter(event="recipes_changed").count() == 3


def test_a_recipe_that_does_not_fit_is_refused_with_the_reason_and_changes_nothing(filesystem, admin_user):
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=filesystem))
    wrong = {"tool": "write_file", "schemaDigest": "0" * 64, "kind": "compensate",
             "compensation": {"tool": "delete_file", "arguments": {"path": "$request.body#/path"}}}
    with pytest.raises(journal_services.RecipesRefused) as refused:
        services.save_recipe(server=server, raw=wrong, by=admin_user)
    assert "no longer applies" in refused.value.message
    assert "'delete_file' is not a tool" in refused.value.message
    assert ToolServer.objects.get(name="fs").recipes == [] and not PolicyChange.objects.exists()


def test_a_pack_recipe_whose_tool_changed_is_not_applied_and_says_why(filesystem, admin_user):
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=filesystem))
    changed = [{**tool, "inputSchema": {"type": "object"}} if tool["name"] == "edit_file" else tool
               for tool in server.catalogue]
    server = journal_services.save_catalogue(server=server, tools=changed)
    used = services.use_pack(server=server, pack="filesystem", by=admin_user)
    assert used.applied == ["write_file", "move_file", "create_directory"]
    assert "no longer applies" in used.skipped["edit_file"][0]
    assert PolicyChange.objects.get(event="recipes_changed").data["by"] == "ada"
