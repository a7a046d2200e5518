"""Issue 44 in a real browser, desktop and phone (390×844), for the findings the other journeys do not walk:
the simulator on the unchanged Default policy says nothing would change (a recipe's versioned read was held
in its replay); Pause and Abort sit at the top of an executing plan and keep keyboard focus while its page
updates itself every second; a run shows only its changes and failures on asking."""

import pytest

from approver import services
from approver.models import Plan
from journal import services as journal_services
from journal.models import Run
from tests.approver.services.test_approvals import approve, enrolled, relying_party  # noqa: F401
from tests.approver.services.test_held_calls import set_policy
from tests.browser.conftest import sign_in
from tests.journal.helpers import run_agent
from tests.journal.test_conformance import command, make_world
from tests.services import needs_chromium, needs_node

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]

SIZES = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


def log_in(browser, base, username, size):
    page = browser.new_context(viewport=size).new_page()
    page.goto(f"{base}/login/")
    sign_in(page, username)
    page.wait_for_load_state()
    return page


@needs_node
@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_the_simulator_on_the_unchanged_default_policy_changes_nothing(recorder, dana, admin_user, tmp_path,
                                                                        chromium, size):
    world = tmp_path / "world"
    make_world("filesystem", world)
    fs = journal_services.refresh_catalogue(server=journal_services.register_tool_server(
        name="fs", command=" ".join(command("filesystem", world, ""))))
    services.use_pack(server=fs, pack="filesystem", by=admin_user)
    default = set_policy(admin_user, ask_timeout=1)
    _, token = journal_services.create_agent(name="files-bot", on_behalf_of=dana)
    (world / "brief.md").write_text("# Brief\n")

    async def script(client):
        for n in range(3):
            await client.call_tool("fs__write_file", {"path": str(world / "brief.md"), "content": f"{n}\n"})

    run_agent(recorder, token, script)
    assert {s.policy_decision["decision"] for s in Run.objects.get().steps.all()} == {"allow"}
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        ada = log_in(browser, base, "ada", size)
        ada.goto(f"{base}/policies/{default.pk}/")
        ada.click("button[name=simulate]")
        text = ada.locator("#simulation").inner_text()
    assert "3 allowed" in text  # as the journal says: the recipe's read took a version
    assert "No recent call would be decided differently from today." in text


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_pause_and_abort_are_at_the_top_and_keep_focus_while_the_plan_updates(
        recorder, globex, sample_servers, on_call, approver_user, second_approver, chromium, size):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    Plan.objects.filter(pk=plan.pk).update(state=Plan.State.EXECUTING)  # no worker: it stays executing
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        ana = log_in(browser, base, "ana", size)
        ana.goto(f"{base}/plans/{plan.public_id}/")
        pause = ana.locator("#controls button", has_text="Pause after the current item")
        assert pause.bounding_box()["y"] < ana.locator("#checks").bounding_box()["y"]
        pause.focus()
        ana.wait_for_timeout(2500)  # two of the fragment's updates
        focused = ana.evaluate("document.activeElement.textContent")
        live = ana.locator("#progress-live").inner_text()
    assert focused == "Pause after the current item"
    assert live == "Undoing now: 0 of 2 actions done."


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_a_run_shows_only_its_changes_and_failures_on_asking(recorder, globex, on_call, chromium, size):
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        olivia = log_in(browser, base, "olivia", size)
        olivia.goto(f"{base}/runs/{globex.public_id}/")
        olivia.click("#step-filter a")
        olivia.wait_for_url("**?only=changes")
        shown = olivia.locator("ol.timeline > li").evaluate_all("items => items.map(i => i.id)")
        said = olivia.locator("#step-filter").inner_text()
    assert shown == ["step-2", "step-3", "step-4"]  # the read of the deal (step 1) went well: not shown
    assert said.startswith("Showing only the steps that changed something or failed")
