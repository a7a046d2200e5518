"""Undo through an app's screens (the HATP draft's `via: "ui"`), against the sample `desk`: the agent edits a
record and sends another to the trash through the Recorder; the plan lists both as undone through the app's
screens, with what their fingerprints cover, always for a person to sign; executing replays the app's own way
back and counts an item only once the app shows the earlier state again."""

import pytest

from approver import services, tasks
from approver.models import AutonomyPolicy, Plan
from journal import services as journal_services
from journal.models import Step
from tests.journal.helpers import register_samples, run_agent

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import run_plan

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def desk_run(recorder, sample_servers, dana, monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    register_samples(sample_servers, names=("desk",))
    _, token = journal_services.create_agent(name="desk-bot", on_behalf_of=dana)

    async def script(client):
        await client.call_tool("desk__open_record", {"id": "C-77"})
        edited = await client.call_tool(
            "desk__edit_record", {"id": "C-77", "status": "Customer", "owner": "bo"}
        )
        trashed = await client.call_tool("desk__trash_record", {"id": "C-78"})
        return edited, trashed

    edited, trashed = run_agent(recorder, token, script)
    assert not edited.is_error and not trashed.is_error
    return Step.objects.get(number=2).run


def records(sample_servers):
    import httpx

    return httpx.post(f"{sample_servers.thread.base}/desk/colleague/edit_record", json={"id": "C-77"}).json()


def checked_plan(run, on_call) -> Plan:
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong customer", from_step=1)
    return services.run_checks(plan=plan, check_round=plan.check_round)


def test_a_ui_change_is_journaled_with_its_fingerprint_and_can_be_undone_by_the_app(desk_run):
    edit = desk_run.steps.get(number=2)
    assert edit.reversibility == "compensate" and edit.declaration["via"] == "ui" and edit.undo_problems == []
    assert edit.effect_version.startswith("fp:") and edit.receipt_verified is True
    assert edit.effect_fingerprint == {"screen": "Records › C-77",
                                       "fields": {"title": "Globex", "status": "Customer", "owner": "bo"}}
    assert desk_run.steps.get(number=3).effect_fingerprint["screen"] == "Trash › C-78"


def test_the_plan_lists_ui_undos_for_a_person_to_sign_whatever_the_policies_say(
        desk_run, on_call, admin_user, client):
    services.save_policy(row=AutonomyPolicy(name="Trusting", scope="everything", auto_run_plans=True,
                                            decisions={"compensate_api": "allow", "compensate_ui": "allow",
                                                       "compensate_no_version": "allow", "none": "allow",
                                                       "unknown": "allow"}), by=admin_user)
    plan = checked_plan(desk_run, on_call)
    assert plan.state == "ready" and not plan.approved_by_policy  # a person signs, even so
    undo = list(plan.items.filter(action="compensate").order_by("position"))
    assert [(i.step.number, i.via, i.check_status) for i in undo] == [(3, "ui", "ok"), (2, "ui", "ok")]
    assert all("whatever the policies say" in i.needs_human for i in undo)
    assert "Restore" in undo[0].check_detail["wouldDo"]
    assert services.plan_content(plan)["items"][1]["effect"]["fingerprint"]["fields"]["owner"] == "bo"
    client.force_login(on_call)
    page = client.get(f"/plans/{plan.public_id}/").content.decode()
    assert "undone through the app&#x27;s screens" in page or "undone through the app's screens" in page
    assert "<strong>Records › C-77</strong>: title “Globex”, status “Customer”, owner “bo”" in page


def test_executing_replays_the_apps_way_back_and_checks_the_earlier_state_shows(
        desk_run, on_call, approver_user, second_approver, sample_servers):
    plan = checked_plan(desk_run, on_call)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    assert plan.state == "completed" and plan.execution_summary == "Reversed 2 of 2 actions"
    summaries = []
    for item in plan.items.filter(action="compensate").order_by("position"):
        assert item.outcome == "compensated"
        assert item.outcome_detail["postcondition"] == "The app shows the earlier state again."
        summaries.append(item.outcome_detail["summary"])
    # Each undo reads as the change it makes: back to the state before the agent, never the agent's own.
    assert summaries[0] == "Put back through the app's screens: C-78 (Initech) restored from the trash"
    assert summaries[1].startswith("Put back through the app's screens: C-77 status: Customer → Prospect")
    replays = [e for e in sample_servers.ledger("desk") if e["op"] == "compensate"]
    assert [e["record"] for e in replays] == ["C-78", "C-77"]  # most recent first
    assert replays[0]["procedure"][-1] == {"do": "click", "button": "Restore"}
    shown = records(sample_servers)["record"]
    assert shown["fields"] == {"title": "Globex", "status": "Prospect", "owner": "dana"}


def test_a_replay_the_app_did_not_take_is_a_failure_never_compensated(
        desk_run, on_call, approver_user, second_approver, sample_servers):
    plan = checked_plan(desk_run, on_call)
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    sample_servers.set_mode("desk", "replay_noop")
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    trash = plan.items.get(step__number=3)
    assert trash.outcome == "compensation_failed" and trash.outcome_detail["postcondition"] is False
    assert trash.outcome_detail["message"].startswith("The app does not show the earlier state")
    assert plan.state == "failed" and not plan.items.filter(outcome="compensated").exists()


def test_a_record_someone_changed_on_its_screen_is_a_conflict_with_what_it_shows_now(desk_run, on_call,
                                                                                     sample_servers):
    import httpx

    httpx.post(f"{sample_servers.thread.base}/desk/colleague/edit_record",
               json={"id": "C-77", "changes": {"status": "Churned"}, "by": "priya"}).raise_for_status()
    plan = checked_plan(desk_run, on_call)
    edit = plan.items.get(step__number=2)
    assert edit.check_status == "conflict" and edit.check_detail["current"]["changedBy"] == "priya"
    assert "status Churned" in edit.check_detail["message"]


def test_two_edits_of_one_record_through_the_screens_are_undone_in_turn_with_no_conflict(
        recorder, sample_servers, dana, on_call, approver_user, second_approver, monkeypatch):
    """Issue 44, build item 3, for undo through an app's screens: the run's own later edit of the record is
    undone first by the same plan, so the earlier edit is no conflict, and reads as the change it makes."""
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)
    register_samples(sample_servers, names=("desk",))
    _, token = journal_services.create_agent(name="desk-bot", on_behalf_of=dana)

    async def script(client):
        await client.call_tool("desk__edit_record", {"id": "C-77", "status": "Customer"})
        await client.call_tool("desk__edit_record", {"id": "C-77", "owner": "bo"})

    run_agent(recorder, token, script)
    plan = checked_plan(Step.objects.get(number=1).run, on_call)
    items = {i.step.number: i for i in plan.items.select_related("step")}
    assert {n: i.check_status for n, i in items.items()} == {1: "ok", 2: "ok"}
    assert "hatp_compensate" not in items[1].undo_words
    assert items[1].undo_words.endswith("once the undos of the run's later changes to this record have run "
                                        "first: changed since only by the run itself, as it left it")
    for user in (approver_user, second_approver):
        approve(plan, user, enrolled(user), choices={})
    plan = run_plan(Plan.objects.get(pk=plan.pk))
    assert plan.execution_summary == "Reversed 2 of 2 actions"
    assert records(sample_servers)["record"]["fields"] == {"title": "Globex", "status": "Prospect",
                                                           "owner": "dana"}
