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
from tests.approver.services.test_held_calls import sales_bot, set_policy  # noqa: F401 - a fixture
from tests.approver.services.test_leases import two_plans  # noqa: F401 - a fixture
from tests.approver.services.test_recipe_undo import pinned_server
from tests.browser.conftest import sign_in
from tests.journal.helpers import run_agent
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
    pinned_server("filesystem", world, by=admin_user, name="fs")
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


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_a_held_call_the_server_refused_says_so_and_the_run_page_says_how_it_stands(
        recorder, sales_bot, sample_servers, admin_user, approver_user, settings, chromium,  # noqa: F811
        size):
    """Finding 8: "Approved and made by ana" for a call that failed; "Held for approval" in orange after it
    was approved and sent."""
    from mcp import MCPError

    from approver.models import ActionRequest
    from journal.models import Step
    from tests.approver.services.test_held_calls import EMAIL, call, decide

    settings.RECORDER_HOLD_WAIT_SECONDS = 0.5
    _, token = sales_bot
    set_policy(admin_user)
    assert call(recorder, token, "mail__send_email", EMAIL).is_error  # told it awaits approval
    action = ActionRequest.objects.get()
    decide(action, approver_user, "approve")
    sample_servers.set_mode("mail", "rpc_error")

    async def refused(client):
        try:
            return await client.call_tool("mail__send_email", EMAIL)
        except MCPError as exc:
            return exc

    assert isinstance(run_agent(recorder, token, refused), MCPError)
    used = Step.objects.filter(tool="send_email").order_by("number").last()
    run_id = action.run.public_id
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        ana = log_in(browser, base, "ana", size)
        ana.goto(f"{base}/actions/{action.public_id}/")
        standing = ana.locator("#standing").inner_text()
        heading = ana.locator("#held-call h2").inner_text()
        ana.goto(f"{base}/runs/{run_id}/")
        first = ana.locator("#step-1 p.policy").inner_text()
    assert standing.startswith(f"Sent by the agent after ana's approval (step {used.number}); the server "
                               "refused it: ")
    assert heading == "Approved by ana, and sent" and "the server did it" not in standing
    assert first.startswith("Held for approval, then approved and sent")


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_an_admin_breaks_a_lease_and_the_holders_page_says_so_at_once(
        two_plans, sample_servers, approver_user, second_approver, admin_user, chromium, recorder,  # noqa: F811
        size):
    """Finding 9: after an admin broke a lease, the holder's page stayed "Ready for sign-off" with no trace of
    the break."""
    from approver.models import RecordLease
    from tests.approver.services.test_executor import run_plan

    holder, waiter = two_plans
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    approve(holder, approver_user, ana, choices={})
    for user, key in ((approver_user, ana), (second_approver, bo)):
        approve(waiter, user, key)
    waiter = run_plan(waiter)
    lease = RecordLease.objects.held().get(plan=holder)
    position = holder.items.get().position
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        ada = log_in(browser, base, "ada", size)
        ada.goto(f"{base}/plans/{waiter.public_id}/")
        form = f"form[action$='/leases/{lease.pk}/break/']"
        ada.fill(f"{form} textarea", "Holder abandoned: its approver is away")
        ada.click(f"{form} button")
        ada.locator("text=Lease broken").wait_for(timeout=10_000)
        ana_page = log_in(browser, base, "ana", size)
        ana_page.goto(f"{base}/plans/{holder.public_id}/")
        broken = ana_page.locator(f"#lease-broken-{position}").inner_text()
    assert broken.startswith("ada (an admin) broke this plan's lease on deal D-881 at ")
    assert "“Holder abandoned: its approver is away”" in broken
