"""The recipe packs for the official servers (issue 23), checked against the catalogues the real pinned
servers list through the Recorder's own client: every recipe parses, names tools the server has, reads with
a tool that says it is read-only, binds only arguments the tool declares, and was written for the schema the
server has now. Every write tool of each server is classified."""

import pytest

from journal import services
from journal.undo import packs, recipes

from ...services import POSTGRES_URL, needs_node, needs_postgres, needs_sqlite_server
from ..test_conformance import command, make_world
from .databases import make_crm, server_command

pytestmark = [pytest.mark.django_db(transaction=True), needs_node, needs_sqlite_server, needs_postgres]
DATABASE_PACKS = ("sqlite", "dbhub", "postgres")


@pytest.fixture
def catalogues(tmp_path):
    listed = {}
    crm = str(make_crm(tmp_path / "crm.db", contacts=3))
    for name in packs.PACKS:
        if name in DATABASE_PACKS:
            line = server_command(name, POSTGRES_URL if name == "postgres" else crm)
        else:
            world = tmp_path / name
            make_world(name, world)
            line = " ".join(command(name, world, ""))
        server = services.register_tool_server(name=name, command=line)
        listed[name] = services.refresh_catalogue(server=server).catalogue
        assert listed[name], f"{name} listed no tools"
    return listed


def test_dbhub_lists_the_same_sql_tool_on_postgresql_as_on_sqlite(catalogues):
    server = services.refresh_catalogue(server=services.register_tool_server(
        name="dbhub-pg", command=server_command("dbhub", POSTGRES_URL)))
    assert [recipes.schema_digest(t) for t in server.catalogue if t["name"] == "execute_sql"] == [
        recipes.schema_digest(t) for t in catalogues["dbhub"] if t["name"] == "execute_sql"]


def test_every_recipe_of_every_pack_fits_its_pinned_server(catalogues):
    for name, catalogue in catalogues.items():
        for raw in packs.pack(name):
            recipe, problems = recipes.parse(raw)
            assert recipe is not None, (name, raw["tool"], problems)
            assert recipes.problems(recipe, catalogue) == [], (name, raw["tool"])


def test_every_write_tool_of_the_pinned_servers_is_classified(catalogues):
    for name, catalogue in catalogues.items():
        writes = {tool["name"] for tool in catalogue
                  if (tool.get("annotations") or {}).get("readOnlyHint") is not True}
        covered = {raw["tool"] for raw in packs.pack(name)}
        assert writes == covered, (name, writes ^ covered)


def test_a_pack_that_does_not_exist_is_named_with_those_that_do():
    with pytest.raises(KeyError, match="there are dbhub, filesystem, git, memory, postgres, sqlite"):
        packs.pack("redis")
