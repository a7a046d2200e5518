"""Executing approved plans against the real sample servers: reverse order, exactly once, honest report.
The servers' ledgers, not our database, say what really happened."""

import pytest

from approver import services, tasks
from approver.models import Plan, PlanItem
from approver.services import executor

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def approved(globex, on_call, approver_user, second_approver, sample_servers, monkeypatch):
    """The Globex plan from step 1 after a colleague raised the deal, approved by Ana and Bo with `choice`
    on the deal's conflict; execution is rung, not run, so each test runs it."""
    rung = []
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: rung.append(args))

    def make(choice: str) -> Plan:
        sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
        plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
        plan = services.run_checks(plan=plan, check_round=plan.check_round)
        for user in (approver_user, second_approver):
            approve(plan, user, enrolled(user), choices={"3": choice})
        plan.refresh_from_db()
        assert plan.state == "approved" and rung == [(plan.pk,)]  # queued when the quorum was reached
        return plan

    return make


def run_plan(plan: Plan, waits: list | None = None) -> Plan:
    """Run the executor as the worker does, answering its requests to be rung again after a backoff at once
    (as if the time had passed); `waits` collects the backoffs it asked for."""
    while True:
        asked = []
        plan = services.execute_plan(plan=plan, later=asked.append)
        if not asked:
            return plan
        if waits is not None:
            waits.extend(round(s) for s in asked)
        PlanItem.objects.filter(plan=plan, retry_at__isnull=False).update(retry_at=None)


def ops(sample_servers, name):
    return [entry for entry in sample_servers.ledger(name) if entry["op"] == "compensate"]


def test_an_approved_plan_is_undone_most_recent_first(approved, sample_servers):
    plan = run_plan(approved("overwrite"))
    assert (
        plan.state == "completed" and plan.execution_summary == "Reversed 2 of 2 actions; 1 cannot be undone"
    )
    outcomes = [(i.step.tool, i.outcome) for i in plan.items.order_by("position").select_related("step")]
    assert outcomes == [("send_email", "irreversible"), ("create_event", "compensated"),
                        ("update_deal", "compensated"), ("get_deal", "no_compensation")]
    # The calendar cancelled the kickoff (and told the attendees) before the deal went back.
    [cancel], [deal] = ops(sample_servers, "calendar"), ops(sample_servers, "crm")
    assert [n["to"] for n in cancel["notices"]] == [
        "dana@acme.example",
        "buyer@globex.example",
        "cto@globex.example",
    ]
    assert deal["version"] == "v15"
    assert deal["idempotencyKey"] == plan.items.get(step__tool="update_deal").idempotency_key
    events = [e.data.get("step") for e in plan.run.entries.filter(event="compensation").order_by("seq")]
    assert events == [4, 3, 2, 1]
    assert not plan.items.filter(holds_step=True).exists()


def test_keeping_the_colleagues_change_leaves_the_deal_alone(approved, sample_servers):
    plan = run_plan(approved("keep_newer"))
    deal = plan.items.get(step__tool="update_deal")
    assert deal.outcome == "skipped" and "keep the newer change" in deal.outcome_detail["message"]
    assert ops(sample_servers, "crm") == [] and len(ops(sample_servers, "calendar")) == 1
    assert plan.state == "partially_completed"


def test_running_the_plan_twice_compensates_nothing_twice(approved, sample_servers):
    plan = approved("overwrite")
    run_plan(plan)
    again = run_plan(plan)
    assert again.state == "completed"
    assert len(ops(sample_servers, "crm")) == 1 and len(ops(sample_servers, "calendar")) == 1


def test_a_colleague_racing_the_undo_is_never_overwritten(approved, sample_servers):
    plan = approved("overwrite")  # Ana and Bo chose to overwrite v14...
    sample_servers.colleague_update("D-881", {"stage": "Negotiation"}, by="priya")  # ...but it is v15 now
    plan = run_plan(plan)
    deal = plan.items.get(step__tool="update_deal")
    assert deal.outcome == "conflict" and deal.outcome_detail["current"]["changedBy"] == "priya"
    assert ops(sample_servers, "crm") == []
    # The deal stays, so nothing it depends on is undone: the read of step 1 needs nothing anyway.
    assert plan.state == "partially_completed"


def test_lapsed_approvals_stop_the_plan_before_anything_runs(approved, sample_servers, approver_user):
    plan = approved("overwrite")
    approver_user.groups.clear()  # Ana lost the approver role after signing
    plan = run_plan(plan)
    assert plan.state == "failed" and "Only 1 of the 2 approvals" in plan.stop_reason
    assert set(plan.items.values_list("outcome", flat=True)) == {"skipped"}
    assert ops(sample_servers, "crm") == [] and ops(sample_servers, "calendar") == []


def test_a_server_that_fails_gets_the_item_failed_and_what_it_depends_on_is_kept(approved, sample_servers):
    plan = approved("overwrite")
    sample_servers.set_mode("calendar", "rpc_error")
    plan = run_plan(plan)
    event = plan.items.get(step__tool="create_event")
    deal = plan.items.get(step__tool="update_deal")
    assert event.outcome == "compensation_failed"
    # The meeting (step 3) stays, and by the all-earlier rule it depends on the deal (step 2): kept too.
    assert deal.outcome == "skipped" and "Step 3 was not undone" in deal.outcome_detail["message"]
    assert ops(sample_servers, "crm") == []
    assert plan.state == "failed"


def test_a_worker_killed_after_the_server_acted_is_picked_up_and_nothing_is_done_twice(
    approved, sample_servers
):
    import anyio
    from django.utils import timezone

    from journal.upstream.client import Upstreams, endpoint_of

    plan = approved("overwrite")
    Plan.objects.filter(pk=plan.pk).update(state="executing")
    event = plan.items.select_related("step__server").get(step__tool="create_event")
    # The dead worker had claimed the meeting and its call reached the calendar, which acted...
    PlanItem.objects.filter(pk=event.pk).update(exec_state="running", attempts=1,
                                                exec_started_at=timezone.now() - timezone.timedelta(hours=1))
    PlanItem.objects.filter(plan=plan, position=1).update(exec_state="done", outcome="irreversible")

    async def dead_workers_call():
        async with Upstreams(timeout=10) as upstreams:
            return await upstreams.call_tool(endpoint_of(event.step.server), "hatp_compensate", {
                **event.arguments, "ifVersion": event.if_version, "idempotencyKey": event.idempotency_key})

    anyio.run(dead_workers_call)
    Plan.objects.filter(pk=plan.pk).update(updated_at=timezone.now() - timezone.timedelta(hours=1))
    # ...then it died. The reconciler rings again; the new worker repeats with the same key.
    assert services.reconcile_execution(older_than=timezone.now() - timezone.timedelta(minutes=5)) == [
        plan.pk
    ]
    plan = run_plan(plan)
    assert plan.state == "completed"
    assert len(ops(sample_servers, "calendar")) == 1 and len(ops(sample_servers, "crm")) == 1
    event.refresh_from_db()
    assert event.outcome == "compensated" and event.attempts == 2


def test_a_stuck_call_to_a_server_that_cannot_promise_idempotency_goes_to_a_human(approved):
    from django.utils import timezone

    plan = approved("overwrite")
    Plan.objects.filter(pk=plan.pk).update(state="executing")
    deal = plan.items.get(step__tool="update_deal")
    PlanItem.objects.filter(pk=deal.pk).update(exec_state="running", dialect="sep3172",
                                               exec_started_at=timezone.now() - timezone.timedelta(hours=1))
    services.reconcile_execution(older_than=timezone.now() - timezone.timedelta(minutes=5))
    deal.refresh_from_db()
    assert deal.exec_state == "done" and deal.outcome == "outcome_unknown"
    assert "may have acted" in deal.outcome_detail["message"]


def test_the_requester_and_approvers_hear_the_result_with_the_to_do_list(approved, on_call, approver_user,
                                                                         second_approver, monkeypatch):
    from django.core import mail

    for user in (on_call, approver_user, second_approver):
        user.email = f"{user.username}@acme.example"
        user.save()
    told = []
    monkeypatch.setattr(tasks.notify_plan_executed, "delay", lambda *args: told.append(args))
    plan = run_plan(approved("overwrite"))
    assert told == [(plan.pk,)]
    assert tasks.notify_plan_executed(plan.pk) == 1 and tasks.notify_plan_executed(plan.pk) == 0
    [message] = mail.outbox
    assert sorted(message.to) == ["ana@acme.example", "bo@acme.example", "olivia@acme.example"]
    assert "Reversed 2 of 2 actions; 1 cannot be undone" in message.subject
    assert "To do by hand, step 4 (send_email): send a correction email" in message.body


def test_the_plan_page_becomes_the_report(approved, client, on_call):
    from django.urls import reverse

    plan = run_plan(approved("overwrite"))
    client.force_login(on_call)
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert "Completed: Reversed 2 of 2 actions; 1 cannot be undone" in page
    assert "To do by hand (never done for you)" in page and "send a correction email" in page
    assert "Cancel &#x27;Kickoff with Globex&#x27;" in page or "Undone: Cancel" in page
    assert "hx-trigger" not in page


def test_an_approver_aborts_before_anything_runs(approved, client, approver_user, sample_servers):
    from django.urls import reverse

    plan = approved("overwrite")
    client.force_login(approver_user)
    client.post(reverse("approver:abort", args=[plan.public_id]))
    plan.refresh_from_db()
    assert plan.state == "failed" and plan.stop_reason == "Aborted by ana."
    assert run_plan(plan).state == "failed"
    assert ops(sample_servers, "crm") == [] and ops(sample_servers, "calendar") == []


def test_an_approved_plan_whose_bell_was_lost_is_rung_again(approved):
    from django.utils import timezone

    plan = approved("overwrite")  # rung, but say the broker lost the message
    Plan.objects.filter(pk=plan.pk).update(updated_at=timezone.now() - timezone.timedelta(hours=1))
    assert services.reconcile_execution(older_than=timezone.now() - timezone.timedelta(minutes=5)) == [
        plan.pk
    ]


def test_compensation_calls_are_journaled_as_a_run_linked_to_the_plan(approved, sample_servers):
    from journal import services as journal_services

    plan = run_plan(approved("overwrite"))
    undo_run = plan.compensation_run
    calls = list(undo_run.steps.order_by("number").values_list("server_name", "tool", "status"))
    assert calls == [("calendar", "hatp_compensate", "ok"), ("crm", "hatp_compensate", "ok")]
    header = undo_run.entries.get(seq=1)
    assert (
        header.event == "run"
        and header.data["agent"].startswith("Undo of ")
        and header.data["onBehalfOf"] is None
    )
    first_call = undo_run.entries.get(seq=2)
    assert first_call.event == "call" and first_call.data["plan"] == str(plan.public_id)
    assert first_call.data["undoes"] == {"run": str(plan.run.public_id), "step": 3}
    assert (
        first_call.data["arguments"]["idempotencyKey"]
        == plan.items.get(step__tool="create_event").idempotency_key
    )
    assert journal_services.verify_run(run=undo_run).ok
    # The plan's own run points at each call, in its chain.
    event = plan.items.get(step__tool="create_event")
    assert event.call_step.run_id == undo_run.pk
    kept = plan.run.entries.get(event="compensation", data__step=3)
    assert kept.data["call"] == {"run": str(undo_run.public_id), "step": event.call_step.number}


def test_a_paused_plan_starts_nothing_until_it_is_resumed(
    approved, sample_servers, approver_user, monkeypatch
):
    plan = approved("overwrite")
    keep = executor._keep_outcome

    def pause_after_the_first(plan_, item, verdict, now):
        keep(plan_, item, verdict, now)
        services.pause_plan(plan=plan_, by=approver_user)

    monkeypatch.setattr(executor, "_keep_outcome", pause_after_the_first)
    paused = run_plan(plan)
    assert paused.state == "paused" and paused.paused_by == "ana"
    assert list(paused.items.order_by("position").values_list("exec_state", flat=True)) == [
        "done",
        "",
        "",
        "",
    ]
    assert ops(sample_servers, "calendar") == []
    # A bell for a paused plan (the reconciler, a duplicate) does nothing.
    monkeypatch.setattr(executor, "_keep_outcome", keep)
    assert run_plan(plan).state == "paused"
    assert not services.pause_plan(plan=plan, by=approver_user)

    assert services.resume_plan(plan=plan, by=approver_user)
    done = run_plan(plan)
    assert done.state == "completed" and len(ops(sample_servers, "calendar")) == 1
    events = list(
        plan.run.entries.filter(event__in=["plan_paused", "plan_resumed"]).values_list("event", flat=True)
    )
    assert events == ["plan_paused", "plan_resumed"]


def test_aborting_a_paused_plan_skips_what_had_not_started(approved, sample_servers, approver_user):
    plan = approved("overwrite")
    assert services.pause_plan(plan=plan, by=approver_user)
    assert services.abort_plan(plan=plan, by=approver_user)
    plan.refresh_from_db()
    assert plan.state == "failed" and plan.stop_reason == "Aborted by ana."
    assert set(plan.items.values_list("outcome", flat=True)) == {"skipped"}
    assert ops(sample_servers, "calendar") == [] and ops(sample_servers, "crm") == []


def test_a_second_worker_waits_while_an_item_of_the_plan_is_in_flight(approved, sample_servers):
    from django.utils import timezone

    plan = approved("overwrite")
    Plan.objects.filter(pk=plan.pk).update(state="executing")
    first = plan.items.get(position=1)
    PlanItem.objects.filter(pk=first.pk).update(exec_state="running", exec_started_at=timezone.now())
    # Rung twice: this worker must not start item 2 while item 1 is still with another worker.
    assert run_plan(plan).state == "executing"
    assert list(plan.items.order_by("position").values_list("exec_state", flat=True)) == [
        "running",
        "",
        "",
        "",
    ]
    assert ops(sample_servers, "calendar") == []


def test_an_approver_pauses_and_resumes_from_the_page(approved, client, approver_user, on_call):
    from django.urls import reverse

    plan = approved("overwrite")
    url = reverse("approver:plan_detail", args=[plan.public_id])
    client.force_login(on_call)
    assert "Pause after the current item" not in client.get(url).content.decode()  # not on-call's to press
    client.force_login(approver_user)
    assert "Pause after the current item" in client.get(url).content.decode()
    client.post(reverse("approver:pause", args=[plan.public_id]))
    page = client.get(url).content.decode()
    assert "Paused by ana" in page and ">Resume</button>" in page and "hx-trigger" not in page
    response = client.post(reverse("approver:pause", args=[plan.public_id]), follow=True)
    assert "This plan is paused; it cannot be paused." in response.content.decode()
    client.post(reverse("approver:resume", args=[plan.public_id]))
    plan.refresh_from_db()
    assert plan.state == "executing" and plan.paused_by == ""
    # Issue 44, finding 10: Pause and Abort at the top, outside the fragment the page replaces every second
    # (so they keep focus), and the progress told to screen readers.
    page = client.get(url).content.decode()
    controls, fragment = page.index('id="controls"'), page.index('<div id="checks"')
    assert controls < fragment and controls < page.index("Pause after the current item") < fragment
    assert controls < page.index("Abort: skip what has not started") < fragment
    assert '<p id="progress-live" class="visually-hidden" role="status" aria-live="polite"></p>' in page
    live = client.get(f"{url}?was=executing", headers={"HX-Request": "true"}).content.decode()
    assert "Pause after the current item" not in live  # the fragment leaves them be
    assert '<span id="progress-live" hx-swap-oob="innerHTML">Undoing now: 0 of 2 actions done.</span>' in live
    # A change of state redraws the whole page, controls and all.
    assert client.get(f"{url}?was=paused", headers={"HX-Request": "true"}).headers["HX-Refresh"] == "true"


def test_no_worker_sleeps_through_a_backoff_and_an_abort_comes_before_the_next_try(
        approved, sample_servers, settings, approver_user, client):
    from django.urls import reverse

    settings.TOOL_SERVER_TIMEOUT = 1
    sample_servers.set_mode("calendar", "act_then_hang")  # it acts, but its answer never comes
    plan = approved("overwrite")
    asked = []
    plan = services.execute_plan(plan=plan, later=asked.append)
    sample_servers.set_mode("calendar", "normal")
    event = plan.items.get(step__tool="create_event")
    assert plan.state == "executing" and [round(s) for s in asked] == [1]  # rung again in 1 s, not slept
    assert event.exec_state == "" and event.retry_at is not None and event.attempts == 1
    assert event.outcome_detail["retrying"]["mayHaveActed"] is True
    client.force_login(approver_user)
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert "Trying again at" in page and "(try 2 of 4)" in page

    assert services.abort_plan(plan=plan, by=approver_user)
    plan = services.execute_plan(plan=plan, later=asked.append)  # the ring that was asked for
    event.refresh_from_db()
    # Its one try may have acted, so after the abort nobody knows: a human must look.
    assert event.outcome == "outcome_unknown" and "stopped before trying again: Aborted by ana." in \
        event.outcome_detail["message"]
    assert plan.state == "failed" and len(ops(sample_servers, "calendar")) == 1
    assert plan.items.get(step__tool="update_deal").outcome == "skipped"


@pytest.fixture
def trusting(admin_user):
    """A policy that lets safe reversal plans run without a human."""
    from approver import policy
    from approver.models import AutonomyPolicy

    return services.save_policy(row=AutonomyPolicy(name="Trusting", scope="everything", auto_run_plans=True,
                                                   decisions=dict(policy.DEFAULT_DECISIONS)), by=admin_user)


@pytest.fixture
def deal_run(recorder, sample_servers, dana):
    """A run that only moved a deal's stage (through the CRM's API, no side effect, no cost)."""
    from journal import services as journal_services
    from journal.models import Run, ToolServer
    from tests.journal.helpers import register_samples, run_agent

    if not ToolServer.objects.filter(name="crm").exists():
        register_samples(sample_servers, names=("crm",))
    _, token = journal_services.create_agent(name="deal-bot", on_behalf_of=dana)

    async def script(client):
        await client.call_tool("crm__update_deal", {"deal_id": "D-882", "stage": "Won"},
                               meta={"hatp/journal": {"runId": "deals"}})

    run_agent(recorder, token, script)
    return Run.objects.get(key="run:deals")


def test_a_safe_plan_runs_without_a_human_when_the_policy_lets_it(globex, deal_run, trusting, on_call,
                                                                  sample_servers, monkeypatch):
    rung = []
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: rung.append(args))
    # Globex: the meeting's cancellation notices and the email still need a human.
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == "ready" and rung == []

    deal = services.request_plan(run=deal_run, requested_by=on_call, reason="wrong stage", from_step=1)
    deal = services.run_checks(plan=deal, check_round=deal.check_round)
    assert deal.state == "approved" and deal.approved_by_policy == deal.digest
    assert rung == [(deal.pk,)]
    done = run_plan(deal)
    assert done.state == "completed" and len(ops(sample_servers, "crm")) == 1
    assert deal_run.entries.filter(event="plan_approved", data__byPolicy=True).count() == 1


@pytest.mark.postgres  # saving a policy locks its row, not the nullable agent and server it names
def test_a_plan_the_policy_let_run_alone_stops_if_the_policy_changes_before_it_runs(
        deal_run, trusting, on_call, admin_user, sample_servers, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    plan = services.request_plan(run=deal_run, requested_by=on_call, reason="wrong stage", from_step=1)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == "approved"
    trusting.auto_run_plans = False
    services.save_policy(row=trusting, by=admin_user)
    done = run_plan(plan)
    assert done.state == "failed" and ops(sample_servers, "crm") == []
    assert done.stop_reason == ("The policies no longer let this plan run without a human: Step 1: policy "
                                "“Trusting” does not let plans run without a human.")


def test_a_second_plan_names_what_the_first_undid_and_completes(
    approved, on_call, approver_user, second_approver, client
):
    first = run_plan(approved("overwrite"))
    assert first.state == "completed"
    second = services.request_plan(run=first.run, requested_by=on_call, reason="again", from_step=1)
    second = services.run_checks(plan=second, check_round=second.check_round)
    assert sorted(second.items.values_list("action", flat=True)) == [
        "already_undone", "already_undone", "cannot_undo", "nothing_to_undo"]
    for user in (approver_user, second_approver):
        approve(second, user, enrolled(user), choices={})
    second = run_plan(Plan.objects.get(pk=second.pk))
    assert second.state == "completed"
    assert (
        second.execution_summary
        == "Nothing left to reverse; 1 cannot be undone; 2 already undone by an earlier plan"
    )
    assert set(second.items.filter(action="already_undone").values_list("outcome", flat=True)) == {
        "already_undone"
    }
    client.force_login(on_call)
    page = client.get(f"/plans/{second.public_id}/").content.decode()
    assert (
        "Completed: Nothing left to reverse; 1 cannot be undone; 2 already undone by an earlier plan" in page
    )
    assert "1 with nothing to undo, 2 already undone</summary>" in page and "skipped" not in page.lower()


@pytest.mark.parametrize("control", ["pause_plan", "abort_plan"])
def test_a_pause_or_an_abort_that_cannot_be_journaled_changes_nothing(approved, approver_user, monkeypatch,
                                                                      control):
    """Issue 22, finding 12: the state and its chain entry were written in separate transactions, so a
    failure to journal left a paused or aborted plan that its run's record never mentioned."""
    from journal import services as journal_services

    plan = approved("overwrite")
    before = Plan.objects.values("state", "stop_reason", "paused_by").get(pk=plan.pk)
    entries = plan.run.entries.count()

    def broken(**kwargs):
        raise RuntimeError("the chain cannot be written")

    monkeypatch.setattr(journal_services, "record_event", broken)
    with pytest.raises(RuntimeError):
        getattr(services, control)(plan=plan, by=approver_user)
    assert Plan.objects.values("state", "stop_reason", "paused_by").get(pk=plan.pk) == before
    assert plan.run.entries.count() == entries
