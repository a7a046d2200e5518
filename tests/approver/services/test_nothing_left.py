"""Nobody signs nothing: a plan whose steps were all undone already (or cannot be) ends as soon as it is
drafted, saying why, with no checks, no signatures and no messages."""

import pytest
from django.core import mail
from django.test import Client

from approver import services
from approver.models.plans import since_words
from approver.services.nothing_left import numbers

from ..test_notifications import emails  # noqa: F401 - a fixture
from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import approved, run_plan  # noqa: F401 - a fixture and a helper

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("steps, words", [
    ([3], "step 3"), ([4, 2, 3], "steps 2–4"), ([1, 3, 5], "steps 1, 3 and 5"), ([2, 2, 3], "steps 2–3"),
])
def test_step_numbers_read_as_a_person_says_them(steps, words):
    assert numbers(steps) == words


def test_a_plan_with_nothing_left_to_undo_ends_at_once(
    approved, on_call, approver_user, globex, emails, settings  # noqa: F811 - the fixtures imported above
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    first = run_plan(approved("overwrite"))
    assert first.state == "completed"
    mail.outbox.clear()
    at = since_words(first.items.get(step__number=2).exec_finished_at)
    again = services.request_plan(run=globex, requested_by=on_call, reason="again", from_step=2)
    assert again.state == "completed" and not again.approvals.exists()
    assert again.execution_summary == (f"Nothing left to undo: steps 2–3 were undone by plan "
                                       f"{str(first.public_id)[:8]} at {at}; step 4 cannot be undone (see "
                                       "the to-do list)")
    assert dict(again.items.values_list("step__number", "outcome")) == {
        2: "already_undone", 3: "already_undone", 4: "irreversible"}
    assert not again.items.filter(holds_step=True).exists()  # its steps are free for another plan
    assert mail.outbox == []  # nobody is asked to sign, or told of, a plan that does nothing
    [ended] = globex.entries.filter(event="plan_executed", data__plan=str(again.public_id))
    assert ended.data["nothingLeft"] is True
    web = Client()
    web.force_login(approver_user)
    html = web.get(services.plan_url(again)).content.decode()
    assert "Completed: Nothing left to undo: steps 2–3 were undone by plan" in html
    assert 'id="sign-off"' not in html
    assert "send a correction email" in html  # the to-do list, with its remedy
