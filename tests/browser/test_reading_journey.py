"""Pages read right the first time, at phone size and on a laptop, by each persona: nothing is wider than a
390 px screen and the top bar's Log out stays on it; the run page counts every step once and shows what
became of a held call whose Recorder stopped (held → never sent → approved by ana); the run list tells runs
apart and marks an open plan; times show in the viewer's own zone, named; a missing control is explained; an
error reads as one. Screenshots of every page at phone size land in VAR_DIR/screenshots."""

import os
import re
import uuid
from pathlib import Path

import pytest
from django.utils import timezone

from approver import services
from approver.models import AutonomyPolicy, Plan
from journal import services as journal_services
from journal.models import Run, Step, ToolServer
from journal.ports import HOLD_LOST_SECONDS
from tests.approver.services.test_approvals import approve, conflicted_plan, enrolled  # noqa: F401
from tests.approver.services.test_executor import run_plan
from tests.approver.services.test_held_calls import decide, hold_email, set_policy
from tests.approver.services.test_leases import two_plans  # noqa: F401
from tests.browser.conftest import sign_in
from tests.services import needs_chromium

pytestmark = [pytest.mark.browser, needs_chromium, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
SHOTS = Path(os.environ.get("VAR_DIR", "var")) / "screenshots"


def log_in(browser, base, username, **context):
    page = browser.new_context(**context).new_page()
    page.goto(f"{base}/login/")
    sign_in(page, username)
    page.wait_for_load_state()
    return page


def fits(page, name: str) -> tuple[int, float]:
    """How wide the page is, and where Log out ends, after saving its screenshot."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"phone-{name}.png"), full_page=True)
    logout = page.locator("header.top button", has_text="Log out")
    right = logout.bounding_box()["x"] + logout.bounding_box()["width"] if logout.count() else 0
    return page.evaluate("document.documentElement.scrollWidth"), right


@pytest.fixture
def story(globex, sample_servers, on_call, admin_user, approver_user):
    """The Globex run with a plan open on it (checked after priya's change: a conflict), and a second run
    whose email was held while its Recorder stopped, settled as never sent, then approved by ana."""
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=2)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    set_policy(admin_user, quorum=1)
    opened, action = hold_email(globex.agent)
    # Its Recorder stopped: nothing has marked the hold for longer than a live one goes unmarked.
    Step.objects.filter(pk=opened.step_id).update(
        started_at=timezone.now() - timezone.timedelta(seconds=HOLD_LOST_SECONDS + 1))
    assert journal_services.reconcile_stale_steps(older_than=timezone.now()) == 1
    decide(action, approver_user, "approve")
    return globex, plan, opened, action


def test_every_page_fits_a_phone_and_reads_right(recorder, story, chromium, approver_user, dana):
    run, plan, opened, action = story
    base = f"http://localhost:{recorder.port}"
    held_public = Run.objects.get(pk=opened.run_id).public_id
    policy, crm = AutonomyPolicy.objects.get(), ToolServer.objects.get(name="crm")
    pages = {
        "olivia": {"runs": "/runs/", "run": f"/runs/{run.public_id}/", "held-run": f"/runs/{held_public}/",
                   "plans": "/plans/", "plan": f"/plans/{plan.public_id}/", "held-calls": "/actions/",
                   "held-call": f"/actions/{action.public_id}/", "agents": "/agents/",
                   "agent": "/agents/sales-bot/"},
        "ana": {"passkeys": "/passkeys/", "plan-to-sign": f"/plans/{plan.public_id}/"},
        "ada": {"policies": "/policies/", "policy": f"/policies/{policy.pk}/", "new-policy": "/policies/new/",
                "servers": "/servers/", "server": f"/servers/{crm.pk}/",
                "recipe": f"/servers/{crm.pk}/?tool=update_deal", "plan-admin": f"/plans/{plan.public_id}/",
                "not-found": f"/plans/{uuid.UUID(int=0)}/"},
        "dana": {"her-agents": "/agents/"},
    }
    widths, read = {}, {}
    with chromium() as browser:
        for who, paths in pages.items():
            page = log_in(browser, base, who, viewport=PHONE, timezone_id="America/New_York")
            read[f"{who}-landing"] = (page.url, page.locator("header.top nav").inner_text())
            for name, path in paths.items():
                page.goto(base + path)
                widths[name] = fits(page, name)
                read[name] = page.locator("main").inner_text()
            if who == "olivia":
                page.goto(f"{base}/runs/{run.public_id}/")
                page.fill("#undo-chosen input[name=reason]", "nothing ticked")
                page.click("#undo-chosen button")
                error = page.locator("p.message.error")
                read["error"] = (error.inner_text(), error.get_attribute("role"),
                                 error.evaluate("e => getComputedStyle(e).color"))
        page = browser.new_context(viewport=PHONE).new_page()
        page.goto(f"{base}/login/")
        widths["login"] = (page.evaluate("document.documentElement.scrollWidth"), 0)

    # Nothing is wider than the phone, and Log out is on the screen.
    assert {name: width for name, (width, _) in widths.items() if width > PHONE["width"]} == {}
    assert all(0 < right <= PHONE["width"] for name, (_, right) in widths.items() if name != "login")

    # The run page counts every step once (the email went through: no policy held it then).
    assert "4 steps: 2 reversible, 1 cannot be undone, 1 read-only" in read["run"]
    assert "1 step: 1 not sent (stopped by a policy)" in read["held-run"]
    # The held call's trail, in the viewer's zone, named (New York in December: EST).
    trail = re.search(r"Its held call: (.*)", read["held-run"]).group(1)
    assert re.fullmatch(r"held \d\d:\d\d EST → this attempt was never sent: the Recorder holding it stopped "
                        r"\d\d:\d\d EST → approved by ana \d\d:\d\d EST", trail), trail
    assert "Waiting for an approver now" not in read["held-run"]
    assert "Nobody is waiting for it now: the attempt at step 1 was not sent" in read["held-call"]
    assert "The agent's next identical call goes through (once)" in read["held-call"]
    # Steps in the open plan offer no second undo, and say where they are.
    assert f"Being undone by plan {str(plan.public_id)[:8]} (ready for sign-off)" in read["run"]
    # The run list tells the two runs apart, shows their state and marks the open plan.
    assert "Deal D-881 stage: Proposal → Won" in read["runs"] and "has failed calls" in read["runs"]
    assert f"undo plan {str(plan.public_id)[:8]}: ready for sign-off" in read["runs"]
    # Human words first: no protocol names or versions in a first read, no raw ISO times anywhere.
    assert "hatp/journal" not in read["run"] and "signed through" not in read["run"]
    assert "v13" not in read["plan"]
    assert not [name for name, text in read.items()
                if isinstance(text, str) and re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text)]
    assert re.search(r"Dec \d+, \d\d:\d\d:\d\d EST", read["policies"])  # the change log's times
    # A missing control is explained; the person an agent acts for lands on her agents.
    assert "Signing is for approvers, and you are not one" in read["plan-admin"]
    assert read["dana-landing"][0].endswith("/agents/") and "Runs" not in read["dana-landing"][1]
    assert "Your agents" in read["dana-landing"][1]
    assert "Runs" in read["olivia-landing"][1] and read["olivia-landing"][0].endswith("/runs/")
    # An error reads as one: red, announced, and says nothing was done.
    text, role, color = read["error"]
    assert text.startswith("Not done: Tick the steps to undo") and role == "alert"
    assert color == "rgb(179, 38, 30)"


def test_an_approver_on_a_phone_reads_what_signing_does(
        recorder, conflicted_plan, chromium, approver_user, second_approver):  # noqa: F811 - a fixture
    plan = conflicted_plan
    base = f"http://localhost:{recorder.port}"
    approve(plan, second_approver, enrolled(second_approver), choices={"3": "keep_newer"})
    plan.refresh_from_db()  # bo's choice is part of what the next approver signs
    enrolled(approver_user)  # so the sign button shows
    with chromium() as browser:
        page = log_in(browser, base, "ana", viewport=PHONE)
        page.goto(f"{base}/plans/{plan.public_id}/")
        width = page.evaluate("document.documentElement.scrollWidth")
        undo = page.locator("#will-be-undone li.item").all_inner_texts()
        choice = page.locator("fieldset.choice").inner_text()
        sign = page.locator("#signatures").inner_text()
        check_again = page.locator("form.check-again")
        secondary = check_again.locator("button").get_attribute("class")
        warning = check_again.inner_text()

    assert width <= PHONE["width"]
    # The deal's undo reads as the change it makes (its server's words are not there after a conflict).
    assert any("Put back stage: Won → Proposal (the agent's change was “Deal D-881 stage: Proposal → Won”)"
               in item for item in undo), undo
    # The conflict's answers say what each does to the record, and which version an overwrite is sent at.
    assert "Leave it as priya left it: skip this undo" in choice
    assert "Undo the stage anyway: priya's amount change is kept" in choice
    assert "version you saw, v14" in choice
    # The sign button's line says what signing does; the quorum says who is still needed.
    assert "You are approval 2 of 2: undoing starts as soon as you sign" in sign
    assert "1 of 2 approvals that count; 1 more needed, from: ana" in sign
    assert plan.digest in sign  # the whole digest beside its short form
    assert secondary == "secondary" and "the approvals given so far no longer count" in warning



def test_nobody_signs_nothing_and_the_page_says_why_without_javascript(
        recorder, two_plans, chromium, approver_user, second_approver, on_call):  # noqa: F811 - a fixture
    first, _ = two_plans  # ops-bot's change to the deal's amount, its run's only step
    base = f"http://localhost:{recorder.port}"
    for user in (approver_user, second_approver):
        approve(first, user, enrolled(user), choices={})
    first = run_plan(Plan.objects.get(pk=first.pk))
    again = services.request_plan(run=first.run, requested_by=on_call, reason="once more", steps=[1])
    assert again.state == "completed" and not again.approvals.exists()
    with chromium() as browser:
        page = log_in(browser, base, "ana", viewport=PHONE, java_script_enabled=False)
        page.goto(f"{base}/plans/{again.public_id}/")
        ended = page.locator("main").inner_text()
        forms = page.locator("#sign-off, form.check-again").count()
        width = page.evaluate("document.documentElement.scrollWidth")
    assert f"Nothing left to undo: step 1 was undone by plan {str(first.public_id)[:8]} at " in ended
    assert "Nobody needed to sign: nothing was left to undo." in ended
    assert forms == 0 and "approvals that count" not in ended and width <= PHONE["width"]
