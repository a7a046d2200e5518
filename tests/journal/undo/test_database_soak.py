"""The differential soak (issue 58): a generated mix of statements through each database pack's real server
(DBHub on PostgreSQL and SQLite, the reference PostgreSQL server, mcp-server-sqlite), and after each call
the database's own view of every table compared with what the record attributes. The figure, rows the
database changed that no step holds and no held, refused or unknown step explains, must be 0.
SOAK_STATEMENTS sets the size (500 in the suite; bench/database_soak.py runs 10,000)."""

import os
import sqlite3

import anyio
import psycopg
import pytest
from mcp.shared.exceptions import MCPError

from approver import services
from journal import services as journal_services
from journal.models import Step
from journal.upstream import database
from tests.approver.services.test_held_calls import set_policy
from tests.journal.helpers import agent_client, run_agent, settle
from tests.services import POSTGRES_URL, needs_node, needs_postgres, needs_sqlite_server

from . import soak
from .databases import AGENT_ROLE, make_crm, pg_rows, postgres_crm, server_command

pytestmark = [pytest.mark.django_db(transaction=True)]
STATEMENTS = int(os.environ.get("SOAK_STATEMENTS", "500"))
REPORT = os.environ.get("SOAK_REPORT", "")  # bench/database_soak.py reads the figures from here
PACKS = {"sqlite": ("sqlite", "mcp-server-sqlite"), "dbhub-sqlite": ("dbhub", "DBHub on SQLite"),
         "dbhub-postgresql": ("dbhub", "DBHub on PostgreSQL"),
         "postgres": ("postgres", "@modelcontextprotocol/server-postgres")}


def tool_for(pack: str, text: str) -> tuple[str, dict]:
    if pack == "sqlite":
        reads = text.lstrip().upper().startswith(("SELECT", "WITH", "PRAGMA"))
        return ("read_query" if reads else "write_query"), {"query": text}
    return ("execute_sql" if pack == "dbhub" else "query"), {"sql": text}


def run_soak(recorder, token: str, agent: str, pack: str, place: str, texts: list[str]) -> soak.Tally:
    tally = soak.Tally()

    def judged(before, text):
        settle(recorder)
        rows = soak.changed(before, soak.snapshot(place))
        step = Step.objects.filter(run__agent__name=agent).order_by("-id").first()
        soak.judge(step, rows, tally, text)

    async def script(client):
        for text in texts:
            before = await anyio.to_thread.run_sync(soak.snapshot, place)
            tool, arguments = tool_for(pack, text)
            try:
                await client.call_tool(f"crm__{tool}", arguments)
            except MCPError:
                pass  # a server's own JSON-RPC error (the reference server's read-only refusal): judged too
            await anyio.to_thread.run_sync(judged, before, text)

    run_agent(recorder, token, script)
    return tally


def run_together(recorder, tokens: list[str], pack: str, place: str, texts: list[str]) -> soak.Tally:
    """`texts` shared out among several agents calling at once, each in a session of its own."""
    tally = soak.Tally()
    before = soak.snapshot(place)

    async def agent(token: str, share: list[str]):
        async def script(client):
            for text in share:
                tool, arguments = tool_for(pack, text)
                try:
                    await client.call_tool(f"crm__{tool}", arguments)
                except MCPError:
                    pass

        async with agent_client(recorder, token) as client:
            await script(client)

    async def main():
        async with anyio.create_task_group() as group:
            for number, token in enumerate(tokens):
                group.start_soon(agent, token, texts[number::len(tokens)])

    anyio.run(main)
    settle(recorder)
    steps = Step.objects.filter(run__agent__name__in=[f"soak-{n}" for n in range(len(tokens))]).order_by("id")
    soak.judge_together(steps, soak.changed(before, soak.snapshot(place)), tally)
    return tally


def registered(pack: str, agent_place: str, recorder_place: str, admin_user) -> None:
    server = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="crm", command=server_command(pack, agent_place), database=recorder_place))
    assert server.catalogue, server.catalogue_error
    services.use_pack(server=server, pack=pack, by=admin_user)


def agents(dana) -> list[str]:
    return [journal_services.create_agent(name=f"soak-{n}", on_behalf_of=dana)[1] for n in range(3)]


def reported(name: str, tally: soak.Tally) -> None:
    print(tally.line(name))
    if REPORT:
        with open(REPORT, "a") as out:
            out.write(tally.line(name) + "\n")
    assert tally.figure == 0, tally.unexplained[:20]
    # Every way a call ends was reached: the reference server runs every text read-only, so its writes fail.
    written = "failed" if name.startswith(PACKS["postgres"][1]) else "compensate"
    assert all(tally.kinds[kind] for kind in (written, "read_only", "held", "refused")), tally.kinds


@pytest.mark.parametrize("name", [pytest.param("sqlite", marks=needs_sqlite_server),
                                  pytest.param("dbhub-sqlite", marks=needs_node)])
def test_every_row_sqlite_changes_is_held_by_a_step_or_explained(name, tmp_path, recorder, admin_user, dana,
                                                                 settings):
    pack, _ = PACKS[name]
    settings.RECORDER_HOLD_WAIT_SECONDS = 0
    path = make_crm(tmp_path / "crm.db", contacts=200)
    with sqlite3.connect(path) as connection:
        for sql in soak.SQLITE_EXTRA:
            connection.execute(sql)
    database.install(str(path), list(soak.CAPTURED))
    registered(pack, str(path), str(path), admin_user)
    set_policy(admin_user)
    token = journal_services.create_agent(name="soak-bot", on_behalf_of=dana)[1]
    reported(PACKS[name][1], run_soak(recorder, token, "soak-bot", pack, str(path),
                                      soak.statements("sqlite", STATEMENTS, seed=58)))
    reported(f"{PACKS[name][1]}, three agents at once", run_together(
        recorder, agents(dana), pack, str(path), soak.statements("sqlite", STATEMENTS // 2, seed=59)))


@needs_postgres
@needs_node
@pytest.mark.parametrize("name", ["dbhub-postgresql", "postgres"])
def test_every_row_postgresql_changes_is_held_by_a_step_or_explained(name, recorder, admin_user, dana,
                                                                     settings):
    pack, _ = PACKS[name]
    settings.RECORDER_HOLD_WAIT_SECONDS = 0
    with postgres_crm(POSTGRES_URL, contacts=200) as (recorder_url, agent_url):
        with psycopg.connect(agent_url, autocommit=True) as connection:
            for sql in soak.PG_EXTRA:
                connection.execute(sql)
        database.install(recorder_url, ["contacts", "companies"], agent_roles=[AGENT_ROLE])
        registered(pack, agent_url, recorder_url, admin_user)
        set_policy(admin_user)
        token = journal_services.create_agent(name="soak-bot", on_behalf_of=dana)[1]
        tally = run_soak(recorder, token, "soak-bot", pack, recorder_url,
                         soak.statements("postgresql", STATEMENTS, seed=58))
        together = run_together(recorder, agents(dana), pack, recorder_url,
                                soak.statements("postgresql", STATEMENTS // 2, seed=59))
        triggers = "SELECT count(*) FROM pg_trigger WHERE tgname = 'undo_capture'"
        assert pg_rows(recorder_url, triggers) == [(2,)]
    reported(PACKS[name][1], tally)
    reported(f"{PACKS[name][1]}, three agents at once", together)

