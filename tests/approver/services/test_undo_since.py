"""Undo everything an agent did since a moment, across its runs ("everything sales-bot did since 03:10"): one
plan, the same checks and sign-off as a run's, executed most recent first against the real sample servers."""

import io
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from approver import planning, services, tasks
from approver.content import site_url
from approver.models import Plan
from approver.models.plans import since_words
from journal import services as journal_services
from journal.models import Agent, Step
from tests.journal.helpers import run_agent

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import ops, run_plan

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def story(globex, recorder):
    """The Globex run; then, after the moment (its step 2 began), two calls by sales-bot each in a session
    of its own with no runId (2025-11-25, as langchain-mcp-adapters makes them), so each is a run of one
    step: Initech's deal moved to Negotiation, and a review booked. Returns the moment."""
    since = Step.objects.get(run=globex, number=2).started_at
    token = journal_services.reset_agent_token(agent=Agent.objects.get(name="sales-bot"))
    for name, arguments in (
        ("crm__update_deal", {"deal_id": "D-882", "stage": "Negotiation"}),
        ("calendar__create_event", {"title": "Initech review", "start": "2026-12-07T10:00:00+00:00",
                                    "attendees": ["dana@acme.example"]}),
    ):
        async def script(client, name=name, arguments=arguments):
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result

        run_agent(recorder, token, script, mode="legacy")
    return since


def sales_bot() -> Agent:
    return Agent.objects.get(name="sales-bot")


def test_everything_since_a_moment_is_one_plan_across_runs_most_recent_first(story, globex, on_call):
    plan = services.request_plan_since(agent=sales_bot(), since=story, requested_by=on_call,
                                       reason="sales-bot went wrong at 03:10")
    runs = list(sales_bot().runs.order_by("started_at"))
    assert len(runs) == 3 and runs[0] == globex and plan.run == globex
    items = [(i.step.run_id, i.step.number, i.step.tool, i.action) for i in services.items_for_page(plan)]
    assert items == [
        (runs[2].pk, 1, "create_event", "compensate"),
        (runs[1].pk, 1, "update_deal", "compensate"),
        (globex.pk, 4, "send_email", "cannot_undo"),
        (globex.pk, 3, "create_event", "compensate"),
        (globex.pk, 2, "update_deal", "compensate"),  # step 1, the read before the moment, is not in it
    ]
    assert set(plan.runs.all()) == set(runs)
    assert (plan.state, plan.compensate_count, plan.cannot_undo_count) == ("checking", 4, 1)
    assert plan.selection_text.startswith("since ") and plan.selection_text.endswith(" UTC")
    # What approvers sign names the moment, and each item its run; the digest is of exactly that.
    content = services.plan_content(plan)
    assert content["selection"] == {"agent": "sales-bot", "since": story.isoformat()}
    assert [(item["run"], item["step"]) for item in content["items"]] == [
        (str(runs[2].public_id), 1), (str(runs[1].public_id), 1), (str(globex.public_id), 4),
        (str(globex.public_id), 3), (str(globex.public_id), 2)]
    assert planning.digest(content) == plan.digest
    # Two runs' step 1 get different idempotency keys.
    keys = [i.idempotency_key for i in plan.items.filter(action="compensate")]
    assert len(set(keys)) == 4
    # The request is on the record of every run it covers.
    for run in runs:
        entry = run.entries.order_by("-seq").first()
        assert (entry.event, entry.data["plan"], entry.data["runs"]) == ("plan", str(plan.public_id), 3)


@pytest.mark.postgres  # its items' keys name the plan, the run and the step: they must fit the column
def test_it_is_checked_signed_and_undone_like_a_runs_plan(story, globex, on_call, approver_user,
                                                           second_approver, sample_servers, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    plan = services.request_plan_since(agent=sales_bot(), since=story, requested_by=on_call, reason="r")
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == "ready" and (plan.checks_done, plan.checks_total) == (4, 4)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan.refresh_from_db()
    assert plan.state == "approved"
    plan = run_plan(plan)
    assert plan.state == "completed"
    assert plan.execution_summary == "Reversed 4 of 4 actions; 1 cannot be undone"
    # Both deals went back, the later change first; both events were cancelled, the later one first.
    assert [op["resource"] for op in ops(sample_servers, "crm")] == ["deal/D-882", "deal/D-881"]
    events = Step.objects.filter(tool="create_event", run__agent__name="sales-bot").order_by("-started_at")
    cancelled = [op["resource"] for op in ops(sample_servers, "calendar")]
    assert len(cancelled) == 2 and all(
        step.effect_resource.endswith(resource) for step, resource in zip(events, cancelled, strict=True))
    # Each run's record says what was done to its own steps.
    runs = list(sales_bot().runs.order_by("-started_at"))
    for run in runs:
        undone = sorted(e.data["step"] for e in run.entries.filter(event="compensation"))
        assert undone == sorted(plan.items.filter(step__run=run).values_list("step__number", flat=True))
    # Every run's record still verifies, and its export carries the two signatures that approved the plan.
    for run in runs:
        assert journal_services.verify_run(run=run).ok
        bundle = journal_services.export_bundle(run=run)
        assert sorted(a["approver"] for a in bundle["approvals"] if a.get("plan") == str(plan.public_id)) == [
            "ana", "bo"]
    # Each journaled compensation call says which run's step it undid.
    calls = plan.compensation_run.entries.filter(event="call").order_by("seq")
    assert [c.data["undoes"] for c in calls] == [
        {"run": str(runs[0].public_id), "step": 1}, {"run": str(runs[1].public_id), "step": 1},
        {"run": str(globex.public_id), "step": 3}, {"run": str(globex.public_id), "step": 2}]


def approved_since(since, on_call, approvers) -> object:
    plan = services.request_plan_since(agent=sales_bot(), since=since, requested_by=on_call, reason="r")
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    for user in approvers:
        approve(plan, user, enrolled(user), choices={})
    plan.refresh_from_db()
    assert plan.state == "approved"
    return plan


def test_a_step_that_stays_keeps_what_it_depends_on_in_its_own_run_only(
        story, globex, on_call, approver_user, second_approver, sample_servers, monkeypatch):
    """Dependencies are within a run: the calendar refuses both undos, so the Globex kickoff stays and keeps
    the Globex deal change before it (the safe rule); Initech's deal, another run, still goes back."""
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    plan = approved_since(story, on_call, (approver_user, second_approver))
    sample_servers.set_mode("calendar", "rpc_error")
    plan = run_plan(plan)
    outcomes = [(i.step.run_id, i.step.tool, i.outcome) for i in plan.items.order_by("position")
                .select_related("step")]
    initech, review = sales_bot().runs.exclude(pk=globex.pk).order_by("started_at")
    assert outcomes == [
        (review.pk, "create_event", "compensation_failed"),
        (initech.pk, "update_deal", "compensated"),
        (globex.pk, "send_email", "irreversible"),
        (globex.pk, "create_event", "compensation_failed"),
        (globex.pk, "update_deal", "skipped"),
    ]
    kept = plan.items.get(step__run=globex, step__tool="update_deal")
    assert "Step 3 was not undone" in kept.outcome_detail["message"]
    assert [op["resource"] for op in ops(sample_servers, "crm")] == ["deal/D-882"]


@pytest.mark.parametrize("case", ["future", "nothing since", "held"])
def test_a_request_that_cannot_be_a_plan_is_refused_and_keeps_nothing(case, story, globex, on_call):
    since = {"future": timezone.now() + timedelta(hours=1), "nothing since": timezone.now(),
             "held": story}[case]
    if case == "held":
        held = services.request_plan(run=globex, requested_by=on_call, reason="first", from_step=3)
    before = Plan.objects.count()
    with pytest.raises(services.PlanRefused) as refused:
        services.request_plan_since(agent=sales_bot(), since=since, requested_by=on_call, reason="r")
    assert Plan.objects.count() == before
    message = refused.value.message
    if case == "future":
        assert "is still to come" in message
    elif case == "nothing since":
        assert message.startswith("sales-bot made no calls since ") and "nothing to undo" in message
    else:
        assert "already in an open plan" in message and refused.value.open_plan == held


def test_the_command_asks_for_a_plan_since_a_moment(story, on_call):
    out = io.StringIO()
    call_command("undo", agent="sales-bot", since=story.isoformat(), reason="r", username=on_call.username,
                 stdout=out)
    plan = Plan.objects.get()
    assert plan.since == story and plan.runs.count() == 3
    assert f"Undo 4 actions since {since_words(story)}; 1 cannot be undone." in out.getvalue()
    for options, words in (({"agent": "sales-bot"}, "Say a run and --from-step N"),
                           ({"agent": "nobody", "since": story.isoformat()}, "No agent is named 'nobody'"),
                           ({"agent": "sales-bot", "since": "yesterday"}, "is not a moment")):
        with pytest.raises(CommandError, match=words):
            call_command("undo", username=on_call.username, **options)


def test_on_call_asks_on_the_agent_page_and_the_plan_page_names_each_run(story, globex, on_call, client):
    client.force_login(on_call)
    run_page = client.get(reverse("journal:run_detail", args=[globex.public_id])).content.decode()
    link = f"{reverse('journal:agent_detail', args=['sales-bot'])}?since="
    assert link in run_page and "undo everything sales-bot did since this run began" in run_page
    moment = timezone.localtime(story).strftime("%Y-%m-%dT%H:%M:%S")
    agent_page = client.get(f"{link}{moment}").content.decode()
    assert f'value="{moment}"' in agent_page
    assert reverse("approver:undo_since", args=["sales-bot"]) in agent_page
    response = client.post(reverse("approver:undo_since", args=["sales-bot"]),
                           {"since": moment, "reason": "it went wrong at 03:10"}, follow=True)
    plan = Plan.objects.get()
    assert response.redirect_chain[-1][0] == reverse("approver:plan_detail", args=[plan.public_id])
    assert plan.state == "drafting" and "Undo what sales-bot did since " in response.content.decode()
    services.draft_plan(plan=plan)
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert f"Undo 4 actions by sales-bot since {since_words(plan.since)} for Dana" in page
    assert "in 3 runs" in page and "Step 1 of the run begun " in page and "Step 4 of the run begun " in page
    # Every run it covers lists it, not only the first.
    for run in sales_bot().runs.all():
        run_page = client.get(reverse("journal:run_detail", args=[run.public_id])).content.decode()
        assert reverse("approver:plan_detail", args=[plan.public_id]) in run_page


@pytest.mark.parametrize(("data", "message"), [
    ({"since": "", "reason": "r"}, "Say since when"),
    ({"since": "not a time", "reason": "r"}, "Give the moment as a date and a time"),
    ({"since": "2026-12-01T03:10", "reason": ""}, "Say why this should be undone"),
])
def test_a_bad_request_on_the_agent_page_is_a_clear_error_and_makes_no_plan(story, on_call, client, data,
                                                                            message):
    client.force_login(on_call)
    response = client.post(reverse("approver:undo_since", args=["sales-bot"]), data, follow=True)
    assert response.redirect_chain[-1][0] == reverse("journal:agent_detail", args=["sales-bot"])
    assert message in response.content.decode() and not Plan.objects.exists()


def test_only_on_call_is_offered_the_form(story, approver_user, client):
    client.force_login(approver_user)
    page = client.get(reverse("journal:agent_detail", args=["sales-bot"])).content.decode()
    assert "sales-bot" in page and reverse("approver:undo_since", args=["sales-bot"]) not in page
    assert client.post(reverse("approver:undo_since", args=["sales-bot"]),
                       {"since": "2026-12-01T03:10", "reason": "r"}).status_code == 403


def test_the_command_prints_the_sites_address_the_demo_wrote_down(story, on_call, settings, tmp_path,
                                                                   monkeypatch):
    """Issue 43: `manage.py undo` in another terminal printed links on port 8000 while the demo ran on
    another: without PUBLIC_URL of its own, a command prints the address the running demo wrote down."""
    monkeypatch.delenv("PUBLIC_URL", raising=False)
    settings.VAR_DIR = tmp_path
    (tmp_path / "public-url").write_text("http://localhost:8123\n")
    out = io.StringIO()
    call_command("undo", agent="sales-bot", since=story.isoformat(), username=on_call.username, stdout=out)
    plan = Plan.objects.get()
    assert out.getvalue().splitlines()[-1] == f"http://localhost:8123/plans/{plan.public_id}/"
    monkeypatch.setenv("PUBLIC_URL", "https://undo.example")  # given one of its own, it is that
    assert site_url() == settings.PUBLIC_URL.rstrip("/")


def test_in_berlin_the_form_shows_and_reads_berlin_time_and_undoes_the_right_hour(story, globex, on_call,
                                                                                  client):
    """Issue 44, finding 6: the form was pre-filled and read in UTC beside times shown in the viewer's zone.
    The browser names its zone (the `zone` cookie, static/times.js); every time is shown and read in it."""
    client.force_login(on_call)
    client.cookies["zone"] = "Europe%2FBerlin"
    berlin = story.astimezone(ZoneInfo("Europe/Berlin"))
    run_page = client.get(reverse("journal:run_detail", args=[globex.public_id])).content.decode()
    assert 'data-zone="Europe/Berlin"' in run_page
    link = run_page.split('undo-since-link">Or <a href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    agent_page = client.get(link).content.decode()
    # The link carries the run's start, shown in Berlin (not step 2's start: a second apart at times).
    shown = globex.started_at.astimezone(berlin.tzinfo).strftime("%Y-%m-%dT%H:%M:%S")
    assert f'value="{shown}"' in agent_page and "Since (Europe/Berlin)" in agent_page
    typed = berlin.strftime("%Y-%m-%dT%H:%M:%S")
    client.post(reverse("approver:undo_since", args=["sales-bot"]), {"since": typed, "reason": "r"})
    plan = Plan.objects.get()
    assert plan.since == story.replace(microsecond=0)  # the hour the viewer meant, not one off
    services.draft_plan(plan=plan)
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert f"since {berlin:%Y-%m-%d %H:%M:%S} {berlin.tzname()}" in page
    assert f"of the run begun {globex.started_at.astimezone(berlin.tzinfo):%b %-d, %H:%M:%S %Z}" in page
    # A zone the server does not know is ignored: the site's.
    client.cookies["zone"] = "Mars/Olympus"
    page = client.get(reverse("journal:run_detail", args=[globex.public_id])).content.decode()
    assert 'data-zone="UTC"' in page


def test_the_runs_command_names_its_zone_and_reads_times_in_it(story, globex):
    out = io.StringIO()
    call_command("runs", "--zone", "Europe/Berlin", "--agent", "sales-bot", stdout=out)
    berlin = timezone.localtime(globex.started_at, ZoneInfo("Europe/Berlin"))
    assert out.getvalue().startswith("Times are in Europe/Berlin.\n")
    assert f"{berlin:%Y-%m-%d %H:%M}" in out.getvalue()
    out = io.StringIO()
    call_command("runs", "--zone", "Europe/Berlin", "--agent", "sales-bot", "--since",
                 (berlin - timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M"), stdout=out)
    assert str(globex.public_id) in out.getvalue()  # read in Berlin; in UTC it would be 30 minutes after
    with pytest.raises(CommandError, match="is not a time zone"):
        call_command("runs", "--zone", "Mars/Olympus")


def test_the_undo_command_reads_since_in_the_zone_it_is_given(story, on_call):
    berlin = story.astimezone(ZoneInfo("Europe/Berlin"))
    out = io.StringIO()
    call_command("undo", "--agent", "sales-bot", "--since", f"{berlin:%Y-%m-%dT%H:%M:%S}", "--zone",
                 "Europe/Berlin", "--reason", "r", "--as", on_call.username, stdout=out)
    assert Plan.objects.get().since == story.replace(microsecond=0)
    assert f"since {berlin:%Y-%m-%d %H:%M:%S} {berlin.tzname()}" in out.getvalue()
