"""Nobody signs nothing: a plan whose steps were all undone already (or changed nothing) ends as soon as it
is drafted, saying why, with no checks, no signatures and no messages."""

import pytest
from django.core import mail
from django.test import Client

from approver import services
from approver.models import Plan
from approver.models.plans import since_words
from approver.services.nothing_left import numbers

from ..test_notifications import emails  # noqa: F401 - a fixture
from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import approved, run_plan  # noqa: F401 - a fixture and a helper
from .test_leases import two_plans  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("steps, words", [
    ([3], "step 3"), ([4, 2, 3], "steps 2–4"), ([1, 3, 5], "steps 1, 3 and 5"), ([2, 2, 3], "steps 2–3"),
])
def test_step_numbers_read_as_a_person_says_them(steps, words):
    assert numbers(steps) == words


def test_a_plan_with_nothing_left_to_undo_ends_at_once(
    two_plans, on_call, approver_user, second_approver, emails, settings  # noqa: F811 - the fixtures
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    first, _ = two_plans  # ops-bot's change to the deal's amount, its run's only step
    for user in (approver_user, second_approver):
        approve(first, user, enrolled(user), choices={})
    first = run_plan(Plan.objects.get(pk=first.pk))
    assert first.state == "completed"
    mail.outbox.clear()
    at = since_words(first.items.get().exec_finished_at)
    again = services.request_plan(run=first.run, requested_by=on_call, reason="again", steps=[1])
    assert again.state == "completed" and not again.approvals.exists()
    assert again.execution_summary == (f"Nothing left to undo: step 1 was undone by plan "
                                       f"{str(first.public_id)[:8]} at {at}")
    assert dict(again.items.values_list("step__number", "outcome")) == {1: "already_undone"}
    assert not again.items.filter(holds_step=True).exists()  # its steps are free for another plan
    assert mail.outbox == []  # nobody is asked to sign, or told of, a plan that does nothing
    [ended] = first.run.entries.filter(event="plan_executed", data__plan=str(again.public_id))
    assert ended.data["nothingLeft"] is True
    web = Client()
    web.force_login(approver_user)
    html = web.get(services.plan_url(again)).content.decode()
    assert "Completed: Nothing left to undo: step 1 was undone by plan" in html
    assert 'id="sign-off"' not in html


def test_a_plan_with_a_step_that_cannot_be_undone_still_goes_to_its_approvers(
    approved, on_call  # noqa: F811 - the fixture imported above
):
    first = run_plan(approved("overwrite"))
    again = services.request_plan(run=first.run, requested_by=on_call, reason="again", from_step=2)
    assert again.state == "checking"  # the email cannot be undone: a person reads its remedy and signs
