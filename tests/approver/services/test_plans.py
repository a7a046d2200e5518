"""Reversal plans end to end: built from a real run, checked against the real sample servers."""

import uuid

import pytest
from django.core import mail
from django.core.management import call_command
from django.urls import reverse

from approver import content, notifications, planning, services
from approver.models import Plan, PlanItem
from journal.models import Step
from journal.record.canonical import sha256_hex

pytestmark = pytest.mark.django_db(transaction=True)


def items(plan: Plan) -> list[tuple[int, str, str]]:
    return [(i.step.number, i.step.tool, i.action) for i in services.items_for_page(plan)]


def checked(plan: Plan) -> Plan:
    plan.refresh_from_db()
    result = services.run_checks(plan=plan, check_round=plan.check_round)
    assert result is not None
    return result


def test_undo_from_step_1_lists_the_story_in_reverse_with_the_email_it_cannot_undo(globex, on_call):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    assert items(plan) == [(4, "send_email", "cannot_undo"), (3, "create_event", "compensate"),
                           (2, "update_deal", "compensate"), (1, "get_deal", "nothing_to_undo")]
    assert (plan.state, plan.checks_total, plan.compensate_count, plan.cannot_undo_count) == (
        "checking",
        2,
        2,
        1,
    )
    email, event, deal, _ = services.items_for_page(plan)
    assert email.reason == "delivered to external recipients" and email.remedy.startswith("send a correction")
    assert event.tool == deal.tool == "hatp_compensate"
    assert deal.arguments == {"compensationToken": deal.step.compensation_token} and deal.if_version == "v13"
    assert event.side_effect == "attendees get a cancellation notice"
    # The request is on the run's record.
    entry = globex.entries.order_by("-seq").first()
    assert (entry.event, entry.data["plan"], entry.data["digest"]) == (
        "plan",
        str(plan.public_id),
        plan.digest,
    )


def test_checks_pass_against_the_servers_and_the_plan_becomes_ready(globex, on_call, sample_servers):
    plan = checked(services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1))
    assert plan.state == "ready" and (plan.checks_done, plan.checks_total) == (2, 2)
    event, deal = [i for i in services.items_for_page(plan) if i.action == "compensate"]
    assert (event.check_status, deal.check_status) == ("ok", "ok")
    assert deal.check_detail["wouldDo"] == "Deal D-881 stage: Won → Proposal"
    assert "Kickoff with Globex" in event.check_detail["wouldDo"]
    # A check changes nothing on the servers.
    assert [entry["op"] for entry in sample_servers.ledger("crm")] == ["update_deal"]
    assert globex.entries.order_by("-seq").first().event == "check"


def test_a_colleagues_edit_shows_as_a_conflict_with_both_versions(globex, on_call, sample_servers):
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = checked(services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2))
    deal = next(i for i in services.items_for_page(plan) if i.step.tool == "update_deal")
    assert deal.check_status == "conflict" and deal.if_version == "v13"
    assert deal.check_detail["current"]["version"] == "v14"
    assert deal.check_detail["current"]["changedBy"] == "priya" and deal.check_detail["current"]["changedAt"]
    assert plan.conflict_count == 1


def test_a_colleagues_edit_is_shown_field_by_field_on_the_page_in_the_email_and_in_what_is_signed(
    globex, on_call, approver_user, sample_servers, client
):
    """The CRM gives the deal's fields before and after the agent's change (under its receipt) and now: the
    conflict reads three ways, the changed cells marked, with how long after the agent priya changed it."""
    agents_change = Step.objects.get(run=globex, tool="update_deal")
    assert agents_change.receipt_verified is True
    assert agents_change.effect_fields["before"]["stage"] == "Proposal"
    assert agents_change.effect_fields["after"]["stage"] == "Won"
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = checked(services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2))
    deal = next(i for i in services.items_for_page(plan) if i.step.tool == "update_deal")
    rows = [{"field": "amount", "before": "48000", "left": "48000", "now": "45000"},
            {"field": "stage", "before": "Proposal", "left": "Won", "now": "Won"}]
    assert deal.check_detail["threeWay"] == {"fields": rows}
    # What is shown is what is signed: the rows are in the digested content.
    signed = next(i for i in content.plan_content(plan)["items"] if i["step"] == agents_change.number)
    assert signed["check"]["threeWay"] == {"fields": rows}

    client.force_login(approver_user)
    page = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert '<td data-label="The agent left" class="changed" data-changed="agent"><mark>Won</mark>' in page
    assert '<td data-label="Now" class="changed" data-changed="since"><mark>45000</mark>' in page
    assert "after the agent&#x27;s change" in page or "after the agent's change" in page

    approver_user.email = "ana@acme.example"
    approver_user.save()
    assert notifications.plan_ready(plan) == 1
    [message] = mail.outbox
    assert "Changed since the agent acted:" in message.body
    assert ("amount: 48000 before the agent, 48000 as it left it, 45000 now; stage: Proposal before the "
            "agent, Won as it left it, Won now") in message.body
    assert "changed by priya, less than a minute after the agent's change" in message.body


def test_checks_can_run_again_and_new_results_change_the_digest(globex, on_call, sample_servers):
    plan = checked(services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2))
    first = plan.digest
    assert services.queue_checks(plan=plan, ring=False)
    assert checked(plan).digest == first  # same answers, same content
    sample_servers.colleague_update("D-881", {"amount": 1}, by="priya")
    assert services.queue_checks(plan=plan, ring=False)
    assert checked(plan).digest != first


def test_a_server_that_fails_or_an_expired_window_gets_a_result_not_a_hang(
    globex, on_call, sample_servers, settings
):
    settings.TOOL_SERVER_TIMEOUT = 2
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    event = plan.items.get(step__tool="create_event")
    deal = plan.items.get(step__tool="update_deal")
    # The calendar went down; the deal's window closed while the plan waited.
    sample_servers.set_mode("calendar", "error_5xx")
    PlanItem.objects.filter(pk=deal.pk).update(undo_by="2020-01-01T00:00:00Z")
    plan = checked(plan)
    event.refresh_from_db()
    deal.refresh_from_db()
    assert event.check_status == "unavailable" and "HTTP 5" in event.check_detail["message"]
    assert deal.check_status == "expired"
    assert plan.state == "ready"


def test_an_unknown_token_is_an_error_with_its_class(globex, on_call):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    PlanItem.objects.filter(plan=plan, step__tool="update_deal").update(
        arguments={"compensationToken": "ctk_forged"}
    )
    checked(plan)
    deal = plan.items.get(step__tool="update_deal")
    assert deal.check_status == "error" and deal.check_detail["failureClass"] == "not_found"


def test_sep3172_and_mcp_compensate_items_are_checked_against_the_current_catalogue(
        recorder, sample_servers, dana, on_call):
    from tests.journal.helpers import register_samples, run_agent

    register_samples(sample_servers, names=("payments", "inventory"))
    from journal import services as journal_services

    _, token = journal_services.create_agent(name="shop-bot", on_behalf_of=dana)

    async def script(client):
        meta = {"hatp/journal": {"runId": "shop"}}
        await client.call_tool(
            "payments__charge_payment", {"customer": "globex", "amount": "2500.00"}, meta=meta
        )
        await client.call_tool(
            "inventory__reserve_inventory", {"sku": "SKU-GLOBEX-KIT", "quantity": 3}, meta=meta
        )

    run_agent(recorder, token, script)
    run = Step.objects.get(tool="charge_payment").run
    plan = checked(services.request_plan(run=run, requested_by=on_call, reason="r", from_step=1))
    got = {i.step.tool: (i.action, i.dialect, i.tool, i.check_status) for i in services.items_for_page(plan)}
    assert got["charge_payment"] == ("compensate", "sep3172", "refund_payment", "ok")
    assert got["reserve_inventory"] == ("compensate", "chronomcp", "release_inventory", "ok")
    payment = plan.items.get(step__tool="charge_payment")
    assert payment.arguments == {"transactionId": payment.step.result["structuredContent"]["transactionId"]}
    # Neither dialect reports a version: both are listed, and both say a human must decide.
    assert all(i.needs_human.startswith("No version was reported") for i in plan.items.all())


def test_a_step_can_be_in_one_open_plan_only(globex, on_call):
    first = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=3)
    with pytest.raises(services.PlanRefused) as refused:
        services.request_plan(run=globex, requested_by=on_call, reason="again", from_step=1)
    assert refused.value.open_plan == first and "Step 3 is already in an open plan" in refused.value.message
    assert Plan.objects.count() == 1  # nothing half-made
    assert services.cancel_plan(plan=first, by=on_call)
    second = services.request_plan(run=globex, requested_by=on_call, reason="again", from_step=1)
    assert second.items.count() == 4


def test_a_request_for_a_step_the_run_does_not_have_is_refused(globex, on_call):
    with pytest.raises(services.PlanRefused, match="no step 9"):
        services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=9)
    with pytest.raises(services.PlanRefused, match="no step 7"):
        services.request_plan(run=globex, requested_by=on_call, reason="r", steps=[2, 7])


def test_the_api_returns_the_content_exactly_as_digested(globex, on_call, client):
    plan = checked(services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1))
    client.force_login(on_call)
    body = client.get(reverse("api:plan_detail", args=[plan.public_id])).json()
    assert body["digest"] == plan.digest == sha256_hex(body["content"]) == planning.digest(body["content"])
    assert [i["step"] for i in body["content"]["items"]] == [4, 3, 2, 1]
    deal = body["content"]["items"][2]
    assert deal["compensation"]["ifVersion"] == "v13" and deal["check"]["status"] == "ok"
    assert deal["pulledInBy"] == {"rule": "chosen", "step": None}


def test_undo_and_check_plan_commands(globex, on_call, capsys):
    call_command(
        "undo", str(globex.public_id), "--from-step", "2", "--reason", "wrong deal", "--as", "olivia"
    )
    out = capsys.readouterr().out.splitlines()
    plan = Plan.objects.get()
    assert out[0] == f"Plan {plan.public_id}"
    assert out[1].startswith("Undo 2 actions from step 2; 1 cannot be undone.")
    assert out[2].endswith(f"/plans/{plan.public_id}/")
    call_command("check_plan", str(plan.public_id))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2. step 3 calendar__create_event: ok")
    assert lines[1] == "3. step 2 crm__update_deal: ok Deal D-881 stage: Won → Proposal"
    assert lines[-1].startswith("Plan ready for sign-off; digest ")


def test_the_undo_command_refuses_someone_who_is_not_on_call(globex, approver_user, on_call):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="not an active on-call user"):
        call_command("undo", str(globex.public_id), "--from-step", "1", "--as", approver_user.username)
    with pytest.raises(CommandError, match="not a run id"):
        call_command("undo", "nonsense", "--from-step", "1", "--as", "olivia")
    assert not Plan.objects.exists()


def test_check_plan_refuses_an_unknown_plan():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No plan"):
        call_command("check_plan", str(uuid.uuid4()))
