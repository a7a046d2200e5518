"""Recipes in Chromium (issue 23): an admin puts the filesystem pack in force on the real pinned filesystem
server and writes one recipe of their own, reading its preview against the agent's last call first; later
an approver reads a plan whose recipe undo conflicts with a person's edit, shown as a diff."""

import json

import pytest

from approver import services, tasks
from journal import services as journal_services
from journal.models import Run, ToolServer
from tests.journal.helpers import run_agent
from tests.journal.test_conformance import command, make_world
from tests.services import needs_chromium, needs_node

from .test_sign_off_journey import authenticated_page, enrol

pytestmark = [pytest.mark.browser, needs_chromium, needs_node, pytest.mark.django_db(transaction=True)]


def test_an_admin_puts_a_pack_in_force_writes_a_recipe_and_an_approver_reads_its_conflict(
        recorder, dana, admin_user, on_call, approver_user, chromium, tmp_path, monkeypatch, settings):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    world = tmp_path / "world"
    make_world("filesystem", world)
    journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=" ".join(command("filesystem", world, ""))))
    _, token = journal_services.create_agent(name="files-bot", on_behalf_of=dana)
    (world / "draft.md").write_text("draft\n")

    async def moves(client):
        await client.call_tool("fs__move_file", {"source": str(world / "draft.md"),
                                                 "destination": str(world / "final.md")})

    run_agent(recorder, token, moves)
    base = f"http://localhost:{recorder.port}"
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [base]

    with chromium() as browser:
        ada = authenticated_page(browser, base, "ada")
        ada.click("nav >> text=Servers")
        ada.click("table.servers >> text=fs")
        tools = ada.locator("#tools").inner_text()
        assert "its server says nothing about undoing it, and it has no recipe" in tools
        ada.select_option("select[name=pack]", "filesystem")
        ada.click("button[name=use]")
        ada.locator("text=The filesystem pack is in force on fs for 4 tools.").wait_for(timeout=10_000)
        assert "restore the file's earlier content, byte for byte" in ada.locator("#tools").inner_text()

        # The admin words move_file's undo their own way, and tries it on the agent's move first.
        ada.locator("#tools tr", has_text="move_file").locator("text=Edit its recipe").click()
        editor = ada.locator("textarea[name=recipe]")
        recipe = json.loads(editor.input_value())
        assert recipe["tool"] == "move_file" and recipe["schemaDigest"]
        ada.fill("textarea[name=recipe]", json.dumps({**recipe, "does": "move the file back"}, indent=2))
        ada.click("button[name=preview]")
        preview = ada.locator("#preview")
        preview.wait_for(timeout=10_000)
        assert "step 1" in preview.inner_text()
        assert (f'move_file {{source: "{world / "final.md"}", destination: "{world / "draft.md"}"}}'
                in preview.inner_text())
        ada.click("button[name=save]")
        ada.locator("text=The recipe for move_file is in force on fs.").wait_for(timeout=10_000)
        assert "an admin's recipe: move the file back" in ada.locator("#tools").inner_text()
        log = ada.locator("#recipe-log").inner_text()
        assert "ada" in log and "the filesystem pack" in log

    assert ToolServer.objects.get(name="fs").recipe("move_file")["does"] == "move the file back"

    async def writes(client):
        await client.call_tool("fs__write_file", {"path": str(world / "final.md"), "content": "agent's\n"})

    run_agent(recorder, token, writes)
    (world / "final.md").write_text("agent's\nand a person's line\n")  # a person, afterwards
    run = Run.objects.filter(agent__name="files-bot").order_by("-started_at").first()
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong file", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)

    with chromium() as browser:
        ana = authenticated_page(browser, base, "ana")
        enrol(ana, base, "Ana's phone")
        ana.goto(f"{base}/plans/{plan.public_id}/")
        undo = ana.locator("#will-be-undone").inner_text()
        assert "By an admin's recipe: restore the file's earlier content, byte for byte " \
            "(the filesystem pack" in undo
        changed = ana.locator("#changed-since").inner_text()
        assert "What the agent changed:" in changed and "What changed since:" in changed
        assert "-draft" in changed and "+agent's" in changed  # what the agent did
        assert "+and a person's line" in changed  # and what a person did since
        ana.locator("#changed-since input[value=keep_newer]").check()  # the person's line stays
        ana.click("#sign-off button[value=approve]")
        ana.locator("text=It needs more approvals before it may run").wait_for(timeout=15_000)

    approval = plan.approvals.get()
    assert approval.approver == approver_user and approval.choices == {"1": "keep_newer"}
