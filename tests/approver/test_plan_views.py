"""The plan pages: who may do what, what they read, and that size does not cost queries."""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approver import services
from approver.models import Plan, PlanItem

pytestmark = pytest.mark.django_db(transaction=True)


def undo_url(run):
    return reverse("approver:request_undo", args=[run.public_id])


def test_on_call_asks_to_undo_from_a_step_and_lands_on_the_plan(globex, on_call, client):
    client.force_login(on_call)
    response = client.post(
        undo_url(globex), {"from_step": 2, "reason": "sales-bot picked the wrong deal"}, follow=True
    )
    plan = Plan.objects.get()
    assert response.redirect_chain[-1][0] == reverse("approver:plan_detail", args=[plan.public_id])
    # The request opened the plan; the worker drafts it (here: by hand) while the page says so.
    drafting = response.content.decode()
    assert plan.state == "drafting" and "Drafting: reading the run's steps." in drafting
    assert "Undo from step 2 of sales-bot's run for Dana" in drafting and 'hx-trigger="every 1s"' in drafting
    assert "Will be undone" not in drafting and "Sign-off" not in drafting
    url = reverse("approver:plan_detail", args=[plan.public_id])
    assert f'hx-get="{url}?was=drafting"' in drafting
    # Any change of state refreshes the whole page (its heading, and its controls at the top).
    assert (
        client.get(f"{url}?was=drafting", headers={"HX-Request": "true"}).status_code == 200
    )  # still drafting
    services.draft_plan(plan=plan)
    refresh = client.get(f"{url}?was=drafting", headers={"HX-Request": "true"})
    assert refresh.headers["HX-Refresh"] == "true"  # drafted: the browser reloads the whole page
    page = client.get(url).content.decode()
    assert "Undo 2 actions by sales-bot for Dana" in page
    assert "1. Will be undone, in this order" in page and "2. Cannot be undone" in page
    assert "3. Changed since the agent acted" in page
    assert "Checking with the tool servers: checked 0 of 2." in page
    assert "send a correction email" in page  # the remedy, shown and never performed
    assert plan.reason == "sales-bot picked the wrong deal" and plan.requested_by == on_call


def test_the_progress_fragment_updates_itself_until_the_checks_finish(globex, on_call, client):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    client.force_login(on_call)
    url = reverse("approver:plan_detail", args=[plan.public_id])
    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<div id="checks"') and 'hx-trigger="every 1s"' in fragment
    assert "<html" not in fragment
    services.run_checks(plan=plan, check_round=plan.check_round)
    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "hx-trigger" not in fragment and "Ready for sign-off: checked 2 of 2" in fragment
    assert "Deal D-881 stage: Won → Proposal" in fragment
    assert "Check again" in fragment  # the buttons come with the fragment, no reload needed


def test_a_reason_is_required(globex, on_call, client):
    client.force_login(on_call)
    response = client.post(undo_url(globex), {"from_step": 2, "reason": "  "}, follow=True)
    assert "Say why this should be undone" in response.content.decode()
    assert not Plan.objects.exists()


def test_a_second_request_is_refused_with_a_link_to_the_open_plan(globex, on_call, client):
    first = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=3)
    client.force_login(on_call)
    response = client.post(undo_url(globex), {"from_step": 1, "reason": "again"}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("approver:plan_detail", args=[first.public_id])
    assert "Step 3 is already in an open plan" in response.content.decode()
    assert Plan.objects.count() == 1


@pytest.mark.parametrize("persona", ["approver_user", "admin_user", "outsider"])
def test_only_on_call_may_ask_for_an_undo(globex, persona, request, client):
    client.force_login(request.getfixturevalue(persona))
    assert client.post(undo_url(globex), {"from_step": 1, "reason": "r"}).status_code == 403
    assert not Plan.objects.exists()


def test_anonymous_users_are_sent_to_log_in_and_nothing_happens(globex, client):
    response = client.post(undo_url(globex), {"from_step": 1, "reason": "r"})
    assert response.status_code == 302 and response.url.startswith(reverse("login"))
    assert not Plan.objects.exists()


def test_asking_without_the_csrf_token_is_refused(globex, on_call):
    client = Client(enforce_csrf_checks=True)
    client.force_login(on_call)
    assert client.post(undo_url(globex), {"from_step": 1, "reason": "r"}).status_code == 403
    assert not Plan.objects.exists()


def test_outsiders_cannot_read_plans_or_their_json(globex, on_call, outsider, client):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    client.force_login(outsider)
    for name in ("approver:plan_detail", "api:plan_detail"):
        assert client.get(reverse(name, args=[plan.public_id])).status_code == 403
    assert client.get(reverse("approver:plan_list")).status_code == 403


def test_check_again_and_cancel_follow_roles_and_state(globex, on_call, approver_user, client):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    services.run_checks(plan=plan, check_round=plan.check_round)
    client.force_login(approver_user)
    assert client.post(reverse("approver:cancel", args=[plan.public_id])).status_code == 403
    client.post(reverse("approver:check_again", args=[plan.public_id]))
    plan.refresh_from_db()
    assert plan.state == "checking" and plan.check_round == 2
    client.force_login(on_call)
    client.post(reverse("approver:cancel", args=[plan.public_id]))
    plan.refresh_from_db()
    assert plan.state == "cancelled" and not plan.items.filter(holds_step=True).exists()
    response = client.post(reverse("approver:check_again", args=[plan.public_id]), follow=True)
    assert "it cannot be checked now" in response.content.decode()


def test_the_plan_page_costs_the_same_queries_for_few_and_many_items(globex, on_call, client):
    small = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    services.cancel_plan(plan=small, by=on_call)
    big = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    # Grow the second plan to 40 items by repeating its rows (the page does not care where they came from).
    template = list(big.items.all())
    extra = []
    for n in range(36):
        source = template[n % len(template)]
        source.pk, source.position, source.holds_step = None, 100 + n, False
        extra.append(
            PlanItem(**{f.attname: getattr(source, f.attname) for f in PlanItem._meta.concrete_fields})
        )
    PlanItem.objects.bulk_create(extra)
    client.force_login(on_call)

    def queries(plan):
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("approver:plan_detail", args=[plan.public_id])).status_code == 200
        return len(captured)

    assert queries(small) == queries(big)


def test_admins_see_plans_in_the_admin_but_cannot_edit_them(globex, on_call, client):
    from django.contrib.auth.models import User

    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=1)
    client.force_login(User.objects.create_superuser("root", password="root-password-1"))
    listing = client.get(reverse("admin:approver_plan_changelist"))
    assert listing.status_code == 200 and str(plan.public_id) in listing.content.decode()
    change = reverse("admin:approver_plan_change", args=[plan.pk])
    assert client.post(change, {"state": "approved"}).status_code == 403
    plan.refresh_from_db()
    assert plan.state == "checking"


def test_the_run_page_links_to_its_plans(globex, on_call, client):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    client.force_login(on_call)
    page = client.get(reverse("journal:run_detail", args=[globex.public_id])).content.decode()
    assert reverse("approver:plan_detail", args=[plan.public_id]) in page and "from step 2, checking" in page


def test_admins_set_the_approval_rules_in_the_admin(client):
    from django.contrib.auth.models import User

    from approver.models import ApprovalRules

    client.force_login(User.objects.create_superuser("root", password="root-password-1"))
    response = client.post(reverse("admin:approver_approvalrules_add"), {
        "approver_role": "approver", "quorum": 3, "valid_for": "02:00:00", "separation_of_duties": "on"})
    assert response.status_code == 302
    rules = ApprovalRules.current()
    assert (rules.team, rules.quorum, rules.valid_for.total_seconds()) == (None, 3, 7200)
    # A second row of shared rules is never made: saving them again changes the one row.
    client.post(reverse("admin:approver_approvalrules_add"), {
        "approver_role": "approver", "quorum": 2, "valid_for": "01:00:00", "separation_of_duties": "on"})
    assert ApprovalRules.objects.count() == 1 and ApprovalRules.current().quorum == 2


def test_on_call_ticks_steps_and_the_plan_adds_what_depends_on_them_saying_why(globex, on_call, client):
    client.force_login(on_call)
    page = client.get(reverse("journal:run_detail", args=[globex.public_id])).content.decode()
    assert (
        'form="undo-chosen"' in page and page.count('name="steps"') == 4 and "Undo the chosen steps" in page
    )
    response = client.post(undo_url(globex), {"steps": ["2"], "reason": "the deal was not won"}, follow=True)
    plan = services.draft_plan(plan=Plan.objects.get())
    assert plan.chosen_steps == [2] and plan.from_step is None and plan.selection_text == "steps 2"
    assert response.redirect_chain[-1][0] == reverse("approver:plan_detail", args=[plan.public_id])
    items = {item.step.number: item for item in plan.items.select_related("step")}
    assert items[2].why_included == "chosen" and set(items) == {2, 3, 4}
    for number in (3, 4):  # later steps the chosen one may have led to come in, each saying why
        assert items[number].why_included.startswith("added: ") and "step 2" in items[number].why_included
    shown = client.get(reverse("approver:plan_detail", args=[plan.public_id])).content.decode()
    assert f"Step 3 ({items[3].why_included})" in shown.replace("&#x27;", "'")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"reason": "r"}, "Tick the steps to undo, or undo from one step onwards."),
        (
            {"reason": "r", "from_step": 2, "steps": ["3"]},
            "Tick the steps to undo, or undo from one step onwards.",
        ),
        ({"reason": "r", "steps": ["two"]}, "Steps are chosen by their numbers."),
        ({"reason": "r", "steps": ["-1"]}, "Steps are chosen by their numbers."),
        ({"reason": "r", "steps": ["9"]}, "The run has no step 9."),
        ({"reason": "r", "steps": [str(n) for n in range(1, 502)]}, "Choose at most 500 steps at once"),
    ],
)
def test_a_bad_choice_of_steps_is_a_clear_error_and_makes_no_plan(globex, on_call, client, data, message):
    client.force_login(on_call)
    response = client.post(undo_url(globex), data, follow=True)
    assert response.status_code == 200 and message in response.content.decode()
    assert not Plan.objects.exists()
