"""How a stateless (2026-07-28) agent's calls are grouped into runs, and finding and ending runs by agent and
time, in the browser and in a terminal (`manage.py runs`)."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client as WebClient
from django.utils import timezone

from journal import services
from journal.models import Run

from ..helpers import register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)


def calls(recorder, token, *run_ids):
    """One echo call per entry, in the run the entry names (None: no runId, the idle rule)."""
    async def script(client):
        for run_id in run_ids:
            meta = {"hatp/journal": {"runId": run_id}} if run_id else None
            await client.call_tool("legacy__echo", {"run": run_id or ""}, meta=meta)

    run_agent(recorder, token, script, mode="auto")


def test_a_stateless_agents_calls_are_grouped_by_its_run_id_else_by_time(
    recorder, sample_servers, dana, on_call
):
    register_samples(sample_servers, names=("legacy",))
    _, token = services.create_agent(name="clock", on_behalf_of=dana)
    calls(recorder, token, "task-1", None, "task-1", None)
    # One run per runId; the rest by the idle rule, for the client program the SDK names (issue 43).
    keyed, idle = Run.objects.get(key="run:task-1"), Run.objects.get(key__startswith="idle:")
    assert (keyed.step_count, idle.step_count) == (2, 2)

    # A call after the idle time starts a new run; within it, it joins the latest.
    Run.objects.filter(pk=idle.pk).update(last_activity_at=timezone.now() - timedelta(hours=1))
    calls(recorder, token, None)
    later = Run.objects.filter(key=idle.key).exclude(pk=idle.pk).get()
    assert later.step_count == 1

    # An on-call user ends that run from its page: the next call starts a new one, the ending is on the chain.
    web = WebClient(enforce_csrf_checks=True)
    web.force_login(on_call)
    page = web.get(f"/runs/{later.public_id}/")
    assert b"End this run here" in page.content
    assert web.post(f"/runs/{later.public_id}/end/").status_code == 403  # no CSRF token
    token_value = web.cookies["csrftoken"].value
    answer = web.post(f"/runs/{later.public_id}/end/", HTTP_X_CSRFTOKEN=token_value, follow=True)
    assert b"Run ended: the agent&#x27;s next call starts a new run." in answer.content
    calls(recorder, token, None)
    newest = Run.objects.filter(key=idle.key).exclude(pk__in=[idle.pk, later.pk]).get()
    later.refresh_from_db()
    assert newest.step_count == 1 and later.step_count == 1 and later.ended_at is not None
    assert later.entries.filter(event="ended", data__by="olivia").count() == 1
    assert services.verify_run(run=later).ok

    # A run grouped by the agent's runId is the agent's to end; ending twice is refused too.
    refused = web.post(f"/runs/{keyed.public_id}/end/", HTTP_X_CSRFTOKEN=token_value, follow=True)
    assert (
        b"the agent decides where it ends" in refused.content
        and Run.objects.get(pk=keyed.pk).ended_at is None
    )
    again = web.post(f"/runs/{later.public_id}/end/", HTTP_X_CSRFTOKEN=token_value, follow=True)
    assert b"already ended" in again.content


def test_only_on_call_and_admins_end_runs_and_only_by_post(dana, on_call, approver_user):
    agent, _ = services.create_agent(name="clock", on_behalf_of=dana)
    run = Run.objects.create(agent=agent, key="", team=agent.team)
    web = WebClient()
    assert web.post(f"/runs/{run.public_id}/end/").status_code in (302, 403)  # not signed in
    web.force_login(approver_user)
    assert web.post(f"/runs/{run.public_id}/end/").status_code == 403
    web.force_login(on_call)
    assert web.get(f"/runs/{run.public_id}/end/").status_code == 405
    assert Run.objects.get(pk=run.pk).ended_at is None


def runs_at(dana):
    ada, _ = services.create_agent(name="ada-bot", on_behalf_of=dana)
    bob, _ = services.create_agent(name="bob-bot", on_behalf_of=dana)
    base = timezone.now().replace(microsecond=0) - timedelta(days=1)
    night = Run.objects.create(agent=ada, team=ada.team, started_at=base,
                               last_activity_at=base + timedelta(minutes=40))
    morning = Run.objects.create(agent=ada, team=ada.team, started_at=base + timedelta(hours=6),
                                 last_activity_at=base + timedelta(hours=7))
    other = Run.objects.create(agent=bob, team=bob.team, started_at=base,
                               last_activity_at=base + timedelta(hours=8))
    return base, night, morning, other


def test_the_run_list_finds_runs_by_agent_and_the_time_they_were_active(dana, on_call):
    base, night, morning, other = runs_at(dana)
    web = WebClient()
    web.force_login(on_call)

    def listed(**query):
        page = web.get("/runs/", query)
        assert page.status_code == 200
        return {run.pk for run in page.context["page"]}

    at = timezone.localtime(base + timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M")
    assert listed(since=at, until=at) == {night.pk, other.pk}
    assert listed(agent="ada-bot", since=at, until=at) == {night.pk}
    after = timezone.localtime(base + timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M")
    assert listed(agent="ada-bot", since=after) == {morning.pk}
    page = web.get("/runs/", {"since": "last tuesday"})
    assert page.status_code == 200 and b"Active since: Enter a valid date/time." in page.content


def test_manage_py_runs_lists_and_filters_in_a_terminal(dana):
    base, night, morning, other = runs_at(dana)
    out = StringIO()
    call_command("runs", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "Times are in UTC."  # the listing names its zone (issue 44, finding 6)
    assert [line.split()[0] for line in lines[2:]] == [
        str(run.public_id) for run in (morning, other, night)]  # newest first
    out = StringIO()
    call_command("runs", "--agent", "ada-bot", "--at", (base + timedelta(minutes=20)).isoformat(), stdout=out)
    lines = out.getvalue().splitlines()[1:]
    assert lines[0].startswith("run") and len(lines) == 2 and lines[1].startswith(str(night.public_id))
    assert "idle rule" in lines[1] and "ada-bot" in lines[1]
    out = StringIO()
    call_command("runs", "--agent", "bob-bot", "--until", (base - timedelta(hours=1)).isoformat(), stdout=out)
    assert out.getvalue().strip() == "No runs match."
    with pytest.raises(CommandError, match="is not a time"):
        call_command("runs", "--since", "yesterday")
    with pytest.raises(CommandError, match="No agent named"):
        call_command("runs", "--agent", "nobody")
