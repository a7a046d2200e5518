"""Plan the rest: a plan that stopped short offers a new plan for exactly what it did not undo (and what
depends on it), linked both ways; nothing is undone twice; the approvers are told. Against the sample
servers, whose ledgers say what really happened."""

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse

from approver import notifications, services
from approver.models import Plan

from ..test_notifications import emails  # noqa: F401 - a fixture
from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import approved, ops, run_plan  # noqa: F401 - a fixture and helpers
from .test_overrides import page

pytestmark = pytest.mark.django_db(transaction=True)


def drafted_and_checked(rest: Plan) -> Plan:
    """What the worker does with a rest plan it is rung for: draft it, then check it."""
    assert rest.state == "drafting"
    rest = services.draft_plan(plan=rest)
    return services.run_checks(plan=rest, check_round=rest.check_round)


def steps_of(plan: Plan) -> dict[int, str]:
    """Step number -> its item's action, for every item of the plan."""
    return dict(plan.items.values_list("step__number", "action"))


def test_the_rest_of_a_failed_plan_is_what_it_did_not_undo_and_runs_once(
    approved, sample_servers, on_call, approver_user, second_approver, emails, settings  # noqa: F811
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    sample_servers.set_mode("calendar", "rpc_error")
    first = run_plan(approved("overwrite"))
    assert first.state == "failed" and ops(sample_servers, "crm") == []
    left = {i.step.number: i.outcome for i in first.not_yet_undone().select_related("step")}
    assert left == {3: "compensation_failed", 2: "skipped"}  # the meeting failed; the deal under it stayed
    assert services.rest_refusal(first) == ""
    html = page(first, on_call)
    assert 'id="the-rest"' in html and "<h3>Not undone</h3>" in html and 'id="plan-the-rest"' in html
    assert 'id="left-3"' in html and "Undo failed" in html

    sample_servers.set_mode("calendar", "normal")  # the calendar is back
    web = Client()
    web.force_login(on_call)
    response = web.post(reverse("approver:plan_rest", args=[first.public_id]))
    rest = Plan.objects.get(rest_of=first)
    assert response.status_code == 302 and response["Location"] == services.plan_url(rest)
    assert rest.requested_by == on_call and rest.reason == first.reason and rest.chosen_steps == [2, 3]
    [asked] = first.run.entries.filter(event="plan_rest")
    assert asked.data == {"plan": str(first.public_id), "rest": str(rest.public_id), "by": "olivia",
                          "steps": [2, 3]}

    rest = drafted_and_checked(rest)
    # Exactly the two not undone, and what depends on them (step 4, which cannot be undone, as before).
    assert steps_of(rest) == {2: "compensate", 3: "compensate", 4: "cannot_undo"}
    assert services.plan_content(rest)["selection"] == {"restOf": str(first.public_id)}
    keys = set(first.items.values_list("idempotency_key", flat=True))
    assert not keys & set(rest.items.exclude(idempotency_key="").values_list("idempotency_key", flat=True))
    [drafted] = first.run.entries.filter(event="plan", data__plan=str(rest.public_id))
    assert drafted.data["restOf"] == str(first.public_id)

    # Linked both ways, and the approvers are told what it is the rest of.
    assert 'id="rest-went"' in page(first, on_call) and "The rest went to" in page(first, on_call)
    assert 'id="plan-the-rest"' not in page(first, on_call)
    assert 'id="rest-of"' in page(rest, on_call) and str(first.public_id)[:8] in page(rest, on_call)
    assert rest.state == "ready"
    mail.outbox.clear()
    notifications.plan_ready(rest)
    told = f"This is the rest of plan {str(first.public_id)[:8]}, which stopped short (failed"
    assert mail.outbox and told in mail.outbox[0].body
    api = Client()
    api.force_login(approver_user)
    assert api.get(reverse("api:plan_detail", args=[first.public_id])).json()["rest"] == \
        str(rest.public_id)

    for user in (approver_user, second_approver):
        approve(rest, user, enrolled(user), choices={"3": "overwrite"} if rest.conflict_count else {})
    rest = run_plan(Plan.objects.get(pk=rest.pk))
    assert rest.state == "completed"
    assert len(ops(sample_servers, "crm")) == 1 and len(ops(sample_servers, "calendar")) == 1


def test_what_the_first_plan_undid_is_not_undone_again(
    approved, sample_servers, on_call  # noqa: F811 - the fixture imported above
):
    first = run_plan(approved("keep_newer"))  # the meeting is undone; the deal is left to the colleague
    assert first.state == "partially_completed" and len(ops(sample_servers, "calendar")) == 1
    rest = drafted_and_checked(services.plan_the_rest(plan=first, requested_by=on_call))
    # The deal, and the later steps that depend on it: the meeting, undone already, is not undone again.
    assert steps_of(rest) == {2: "compensate", 3: "already_undone", 4: "cannot_undo"}
    assert rest.compensate_count == 1


def test_there_is_one_rest_and_none_while_an_outcome_is_unknown(
    approved, sample_servers, on_call, approver_user  # noqa: F811 - the fixture imported above
):
    first = run_plan(approved("keep_newer"))
    first.items.filter(step__number=2).update(outcome="outcome_unknown")  # say nobody knows how it went
    with pytest.raises(services.PlanRefused, match="Nobody knows yet whether the undo of step 2 took effect"):
        services.plan_the_rest(plan=first, requested_by=on_call)
    assert "say how it ended (above) first" in page(first, on_call) and not Plan.objects.filter(rest_of=first)
    services.settle_unknown(plan=first, position=first.items.get(step__number=2).position, by=approver_user,
                            settlement="did_not")
    rest = services.plan_the_rest(plan=first, requested_by=on_call)
    with pytest.raises(services.PlanRefused, match="The rest is in plan") as refused:
        services.plan_the_rest(plan=first, requested_by=on_call)
    assert refused.value.open_plan == rest
    services.cancel_plan(plan=rest, by=on_call)  # a cancelled rest frees the steps for another
    assert services.plan_the_rest(plan=first, requested_by=on_call).rest_of == first


def test_a_plan_that_undid_everything_or_has_not_finished_has_no_rest(
    approved, sample_servers, on_call  # noqa: F811 - the fixture imported above
):
    plan = approved("overwrite")
    with pytest.raises(services.PlanRefused, match="Only a plan that has finished"):
        services.plan_the_rest(plan=plan, requested_by=on_call)
    plan = run_plan(plan)
    assert plan.state == "completed"
    with pytest.raises(services.PlanRefused, match="Everything this plan could undo is undone"):
        services.plan_the_rest(plan=plan, requested_by=on_call)
    assert 'id="the-rest"' not in page(plan, on_call)


def test_who_asked_for_the_undo_cannot_approve_its_rest_when_someone_else_asked_for_that(
    approved, sample_servers, on_call, approver_user, second_approver  # noqa: F811 - the fixture above
):
    """Issue 43, finding 9: olivia asks for an undo (and is an approver too); it stops short, and ana presses
    Plan the rest. Separation of duties keeps olivia from approving the rest, as from the first."""
    from django.contrib.auth.models import Group

    from approver import authority
    from journal.auth import roles

    on_call.groups.add(Group.objects.get_or_create(name=roles.APPROVER)[0])
    on_call = type(on_call).objects.get(pk=on_call.pk)  # its roles read afresh
    first = run_plan(approved("keep_newer"))
    assert first.requested_by == on_call
    rest = services.plan_the_rest(plan=first, requested_by=approver_user)
    assert "the undo this plan is the rest of" in authority.signing_refusal(plan=rest, user=on_call)
    assert "You asked for this plan" in authority.signing_refusal(plan=rest, user=approver_user)
    assert authority.signing_refusal(plan=rest, user=second_approver) == ""
    assert on_call not in authority.who_may_sign(rest)
