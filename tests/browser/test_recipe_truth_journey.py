"""Issue 44 on the official memory server, in a real browser at desktop and phone size: an override that keeps
a colleague's newer observation ends "Undone" with the report saying what was kept; a run that creates an
entity and then relates it has a plan with no conflict; an undo the approvers chose to skip is listed under
what will be left alone, never under what will be undone."""

import json

import pytest

from approver import services
from approver.models import Plan
from journal.models import Run
from tests.approver.services.test_approvals import approve, enrolled, relying_party  # noqa: F401
from tests.approver.services.test_executor import run_plan
from tests.approver.services.test_recipe_overrides import entities, memory  # noqa: F401 - a fixture
from tests.browser.conftest import sign_in
from tests.journal.helpers import run_agent
from tests.services import needs_chromium, needs_node

pytestmark = [pytest.mark.browser, needs_chromium, needs_node, pytest.mark.django_db(transaction=True)]

SIZES = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


def story(recorder, memory, on_call) -> Plan:  # noqa: F811 - the fixture's value
    """notes-bot adds an observation to the kickoff, creates Dana and relates her to Ann; priya adds her
    own observation to the kickoff afterwards. The plan from step 1, checked."""
    path, token = memory
    graph = entities(path)
    graph["Ann"] = {"type": "entity", "name": "Ann", "entityType": "person", "observations": []}
    path.write_text("".join(json.dumps(r) + "\n" for r in graph.values()))

    async def script(client):
        await client.call_tool("memory__add_observations", {"observations": [
            {"entityName": "Globex kickoff", "contents": ["agenda sent"]}]})
        await client.call_tool("memory__create_entities", {"entities": [
            {"name": "Dana", "entityType": "person", "observations": []}]})
        await client.call_tool("memory__create_relations", {"relations": [
            {"from": "Dana", "to": "Ann", "relationType": "reports to"}]})

    run_agent(recorder, token, script)
    graph = entities(path)
    graph["Globex kickoff"]["observations"].append("moved to Friday")
    relations = [line for line in path.read_text().splitlines() if '"relation"' in line]
    path.write_text("".join(json.dumps(r) + "\n" for r in graph.values())
                    + "".join(r + "\n" for r in relations))
    plan = services.request_plan(run=Run.objects.get(agent__name="notes-bot"), requested_by=on_call,
                                 reason="wrong notes", from_step=1)
    return services.run_checks(plan=plan, check_round=plan.check_round)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("choice", ["overwrite", "keep_newer"])
def test_a_memory_plan_reads_true_before_and_after_it_runs(
        recorder, memory, on_call, approver_user, second_approver, chromium, size, choice):  # noqa: F811
    plan = story(recorder, memory, on_call)
    checks = {i.step.number: i.check_status for i in plan.items.select_related("step")}
    assert checks == {1: "conflict", 2: "ok", 3: "ok"}  # Dana, then related: the run's own chain
    kickoff = plan.items.get(step__number=1)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={str(kickoff.position): choice})
    base = f"http://localhost:{recorder.port}"
    with chromium() as browser:
        page = browser.new_context(viewport=size).new_page()
        page.goto(f"{base}/login/")
        sign_in(page, "olivia")
        page.goto(f"{base}/plans/{plan.public_id}/")
        will = page.locator("#will-be-undone ol.items").inner_text()
        sentence = page.locator("#sentence").inner_text()
        left = page.locator("#left-alone").inner_text() if choice == "keep_newer" else ""
    assert "Delete exactly the entities the call created: Dana" in will
    assert "Delete exactly the relations the call created" in will
    if choice == "keep_newer":
        assert "Globex kickoff" not in will and "Delete exactly the observations the call added" in left
        assert "It will not touch: Globex kickoff as it is now" in sentence
    else:
        assert "Delete exactly the observations the call added: Globex kickoff" in will
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    with chromium() as browser:
        page = browser.new_context(viewport=size).new_page()
        page.goto(f"{base}/login/")
        sign_in(page, "olivia")
        page.goto(f"{base}/plans/{plan.public_id}/")
        heading = page.locator("#report h2").inner_text()
        item = page.locator(f"#item-{kickoff.position}").inner_text() if choice == "overwrite" else ""
    path, _ = memory
    graph = entities(path)
    assert "Dana" not in graph and '"relation"' not in path.read_text()
    if choice == "overwrite":
        assert heading == "Completed: Reversed 3 of 3 actions"
        assert "The agent's change is taken back, and the newer change is kept" in item
        assert graph["Globex kickoff"]["observations"] == ["booked for Dec 4", "moved to Friday"]
    else:
        assert heading == "Partially completed: Reversed 2 of 3 actions; 1 skipped"
        assert graph["Globex kickoff"]["observations"] == ["booked for Dec 4", "agenda sent",
                                                           "moved to Friday"]
