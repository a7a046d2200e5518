"""Issue 44, finding 4: "Will be undone" listed an undo the approvers chose to skip while "Changed since"
said they had chosen to keep the newer change; and "Changed since" only said that the email has no version,
never that the undoable items are unchanged (the template's condition chained its filters wrongly)."""

import html as entities
import re

import pytest

from approver import services

from .services.test_approvals import approve, conflicted_plan, enrolled, relying_party  # noqa: F401
from .services.test_overrides import page

pytestmark = pytest.mark.django_db(transaction=True)


def part(html: str, element_id: str, end: str) -> str:
    """The words of the element `element_id` (up to its first `end` tag), tags and extra spaces dropped."""
    start = html.index(f'id="{element_id}"')
    inner = html[start:html.index(end, start)]
    return " ".join(entities.unescape(re.sub(r"<[^>]+>", " ", inner.split(">", 1)[1])).split())


def test_an_undo_the_approvers_chose_to_skip_is_listed_as_left_alone_not_as_undone(
        conflicted_plan, approver_user):  # noqa: F811
    approve(conflicted_plan, approver_user, enrolled(approver_user), choices={"3": "keep_newer"})
    conflicted_plan.refresh_from_db()
    html = page(conflicted_plan, approver_user)
    undone = html[html.index('id="will-be-undone"'):html.index('id="left-alone"')]
    assert 'id="item-3"' not in undone and 'id="item-2"' in undone  # the meeting is still undone
    assert "not sent, step 2 stays as it is. The newer change is kept" in part(html, "left-3", "</li>")
    assert "Chosen: Keep the newer change" in part(html, "changed-3", "</li>")


def test_changed_since_says_the_undoable_items_are_unchanged_beside_the_one_with_no_version(
        globex, on_call, approver_user):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=2)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == "ready" and services.conflict_positions(plan) == set()
    said = part(page(plan, approver_user), "changed-since", "</section>")
    assert "Nothing else changed since the agent acted, as far as can be told." in said, said
    assert "there is no version to compare" in said


def test_wording_slips_read_as_sentences(globex, conflicted_plan, on_call, approver_user, client):  # noqa: F811
    """Issue 44, finding 12: "Depends on steps 1–1", "checked 5 of 5 6 Dec", "Since then undo changed it",
    and a library's sign-count message shown as it is (tests/approver/services/test_approvals.py)."""
    from journal import services as journal_services
    from tests.journal.factories import make_run

    client.force_login(on_call)
    agent, _ = journal_services.create_agent(name="plain-bot", on_behalf_of=globex.agent.on_behalf_of)
    run_page = client.get(f"/runs/{make_run(agent, steps=3).public_id}/").content.decode()
    assert "Depends on step 1 (all-earlier rule)" in run_page and "steps 1–1" not in run_page
    assert "Depends on steps 1–2 (all-earlier rule)" in run_page
    words = " ".join(re.sub(r"<[^>]+>", " ", page(conflicted_plan, approver_user)).split())
    assert re.search(r"checked (\d) of \1, at \w{3} \d+, \d\d:\d\d:\d\d", words), words
    item = conflicted_plan.items.get(position=3)
    current = {**item.check_detail["current"], "changedBy": "undo"}
    item.check_detail = {**item.check_detail, "current": current}
    item.save(update_fields=["check_detail"])
    assert "Since then an undo changed it" in part(page(conflicted_plan, approver_user), "changed-3", "</li>")


def test_the_nav_counts_the_plans_waiting_for_me(conflicted_plan, approver_user, second_approver,  # noqa: F811
                                                 on_call, client):
    """Issue 44, finding 10: approvers were not told which plans wait for them."""
    badge = 'title="Ready for sign-off, and yours to sign">'

    def nav(user) -> str:
        client.force_login(user)
        home = client.get("/runs/").content.decode()
        return home[home.index("<nav>"):home.index("</nav>")]

    assert f"{badge}1</span>" in nav(approver_user) and f"{badge}1</span>" in nav(second_approver)
    assert badge not in nav(on_call)  # she asked for it: not hers to sign
    approve(conflicted_plan, approver_user, enrolled(approver_user))
    assert badge not in nav(approver_user) and f"{badge}1</span>" in nav(second_approver)


def test_an_approver_lands_on_what_waits_for_their_signature(conflicted_plan, approver_user,  # noqa: F811
                                                             on_call, client):
    """Issue 44, build item 9: approvers land on what waits for them."""
    client.force_login(approver_user)
    landed = client.get("/", follow=True)
    assert landed.redirect_chain[-1][0] == "/plans/?waiting=me"
    listed = landed.content.decode()
    assert "<h1>Waiting for your signature</h1>" in listed and str(conflicted_plan.public_id) in listed
    approve(conflicted_plan, approver_user, enrolled(approver_user))
    assert client.get("/", follow=True).redirect_chain[-1][0] == "/runs/"  # nothing waits: the runs
    assert "Nothing waits for your signature now." in client.get("/plans/?waiting=me").content.decode()
    client.force_login(on_call)
    assert client.get("/", follow=True).redirect_chain[-1][0] == "/runs/"


def test_plan_rows_say_what_they_undo(conflicted_plan, approver_user, client):  # noqa: F811
    """Issue 44, finding 10: every row's link was the agent's name, and "What" said "from step 2"."""
    client.force_login(approver_user)
    listing = client.get("/plans/").content.decode()
    link = listing[listing.index(f'href="/plans/{conflicted_plan.public_id}/"'):]
    words = " ".join(re.sub(r"<[^>]+>", " ", link[link.index(">") + 1:link.index("</td>")]).split())
    assert words.startswith("Undo from step 2 of the run begun "), words
    assert words.endswith(": 2 to undo, 1 that cannot be"), words


def test_a_sentence_of_a_servers_ends_with_one_full_stop():
    """Issue 44, finding 12: "the remedy is: send a correction email.." read doubled."""
    from django.template import Context, Template

    page = Template("{% load journal_tags %}If it goes wrong, the remedy is: {{ remedy|no_stop|shown }}.")
    for said in ("send a correction email.", "send a correction email", "send a correction email. ",
                 "send a correction email"):
        assert page.render(Context({"remedy": said})) == \
            "If it goes wrong, the remedy is: send a correction email."
    assert page.render(Context({"remedy": "wait..."})) == "If it goes wrong, the remedy is: wait..."
