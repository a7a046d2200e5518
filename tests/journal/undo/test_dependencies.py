"""Inferring links from values, cheap however long the run: the most recent step that had a value, values
too common to mean anything left out, and a bound on links per step."""

import pytest
from django.utils import timezone

from journal import services
from journal.models import RunValue, StepDependency, ToolServer
from journal.undo import dependencies

pytestmark = pytest.mark.django_db


def test_a_value_links_to_the_most_recent_step_that_had_it():
    wanted = [(dependencies.digest("D-881"), "/deal")]
    known = {dependencies.digest("D-881"): (7, "/structuredContent/id", 2)}
    assert dependencies.choose_links(wanted, known) == {7: [{"from": "/structuredContent/id", "to": "/deal"}]}


def test_a_value_most_results_had_links_nothing():
    value = dependencies.digest("Asia/Tokyo")
    assert (
        dependencies.choose_links([(value, "/tz")], {value: (7, "/tz", dependencies.COMMON_AFTER + 1)}) == {}
    )
    assert dependencies.choose_links([(value, "/tz")], {value: (7, "/tz", dependencies.COMMON_AFTER)}) == {
        7: [{"from": "/tz", "to": "/tz"}]}


def test_links_per_step_are_bounded_to_the_most_recent_steps():
    wanted = [(dependencies.digest(f"value-{n}"), f"/a/{n}") for n in range(40)]
    known = {value: (n + 1, "/structuredContent/v", 1) for n, (value, _) in enumerate(wanted)}
    links = dependencies.choose_links(wanted, known)
    assert sorted(links) == list(range(40 - dependencies.MAX_LINKS + 1, 41))


def echo_step(agent, number_value: str, *, extra: dict | None = None):
    """One journaled call that sends `number_value` and whose structured result contains it."""
    server = ToolServer.objects.filter(name="legacy").first() or services.register_tool_server(
        name="legacy", url="http://127.0.0.1:9/mcp")
    arguments = {"ref": number_value, **(extra or {})}
    opened = services.open_step(
        agent=agent,
        run_key="run:long",
        server=server,
        server_name="legacy",
        tool="echo",
        arguments=arguments,
        request_meta=None,
        now=timezone.now(),
    )
    result = {"content": [], "structuredContent": arguments}
    return services.close_step(opened=opened, outcome=services.Outcome(result=result), started=timezone.now(),
                               finished=timezone.now())


def test_in_a_long_run_each_call_links_once_and_common_values_stop_linking(dana):
    agent, _ = services.create_agent(name="clock", on_behalf_of=dana)
    steps = [echo_step(agent, f"ticket-{n}", extra={"zone": "Asia/Tokyo", "at": "12:00"}) for n in range(30)]
    # Every call sends "Asia/Tokyo" and "12:00", which every earlier result had: early on that links it to the
    # step just before; once more than COMMON_AFTER results had them, they link nothing.
    last = steps[-1]
    assert not StepDependency.objects.filter(step=last).exists()
    second = StepDependency.objects.get(step=steps[1])
    assert (second.depends_on_id, second.pointers) == (steps[0].pk, [
        {"from": "/structuredContent/zone", "to": "/zone"}, {"from": "/structuredContent/at", "to": "/at"}])
    assert max(StepDependency.objects.filter(step=s).count() for s in steps) == 1
    # A value that came back once still links, to that step only.
    reuse = echo_step(agent, "ticket-3")
    assert list(StepDependency.objects.filter(step=reuse).values_list("depends_on_id", flat=True)) == [
        steps[3].pk
    ]
    # The index holds one row per value, not one per step that had it.
    assert RunValue.objects.filter(run=last.run).count() == 30 + 2
    assert RunValue.objects.get(run=last.run, digest=dependencies.digest("Asia/Tokyo")).seen == 30
