"""Issue 44, finding 7: the policy simulator replays what was decided. For the unchanged policies it
reproduces every journaled decision exactly, over a journal of every kind made through the real Recorder: a
read, a server's own undo (allowed), a call that cannot be undone (held), one nobody declared (held), a tool
a policy denies, a repeat after an unknown outcome (held by the retry guard), and an admin's recipe whose
read took a version (allowed: the simulator used to hold it), one whose file did not exist (held) and one
with no version to take (held)."""

import pytest
from django.urls import reverse

from approver import policy, policy_book, services, tasks
from approver.models import AutonomyPolicy
from journal import services as journal_services
from journal.models import Step, ToolServer
from tests.journal.helpers import register_samples
from tests.services import needs_node

from ..test_policy_views import form_data
from .test_held_calls import set_policy
from .test_recipe_undo import pinned_server
from .test_retry_guard import TICKET, call, lost_answer

pytestmark = [pytest.mark.django_db(transaction=True), needs_node, pytest.mark.usefixtures("short_timeout")]


@pytest.fixture
def short_timeout(settings):
    """Short enough that the lost answer costs seconds, long enough for the filesystem server's first read
    (node starting on a busy machine): with one second, the recipe's read sometimes timed out, took no
    version, and the write was held instead of allowed."""
    settings.TOOL_SERVER_TIMEOUT = 5  # read when the Recorder starts


def test_the_unchanged_policies_decide_every_journaled_call_as_the_journal_says(
        recorder, sample_servers, dana, admin_user, tmp_path, monkeypatch, client):
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    register_samples(sample_servers, names=("crm", "mail", "legacy", "calendar"))
    world = tmp_path / "world"
    pinned_server("filesystem", world, by=admin_user, name="fs")
    default = set_policy(admin_user, ask_timeout=1)  # as the demo's Default: everything else asks
    services.save_policy(row=AutonomyPolicy(
        name="No new meetings", scope="tool", server=ToolServer.objects.get(name="calendar"),
        tool="create_event", decisions={**policy.DEFAULT_DECISIONS, "compensate_api": "deny"}, ask_timeout=1),
        by=admin_user)
    services.save_policy(row=AutonomyPolicy(
        name="Tickets", scope="server", server=ToolServer.objects.get(name="legacy"), ask_timeout=1,
        decisions={**policy.DEFAULT_DECISIONS, "unknown": "allow"}), by=admin_user)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    (world / "brief.md").write_text("# Brief\n")
    for name, arguments in (
        ("crm__get_deal", {"deal_id": "D-881"}),
        ("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}),
        ("mail__send_email", {"to": "buyer@globex.example", "subject": "Hi", "body": "Hello"}),
        ("calendar__create_event", {"title": "Kickoff", "start": "2026-12-04T15:00:00+00:00",
                                    "attendees": ["dana@acme.example"]}),
        ("fs__write_file", {"path": str(world / "brief.md"), "content": "# Wrong\n"}),
        ("fs__write_file", {"path": str(world / "new.md"), "content": "new\n"}),
        ("fs__move_file", {"source": str(world / "brief.md"), "destination": str(world / "moved.md")}),
    ):
        call(recorder, token, name, arguments)
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    call(recorder, token, "legacy__create_ticket", TICKET)  # the repeat: held by the retry guard

    journaled = {(s.tool, s.number): s.policy_decision["decision"] for s in Step.objects.all()}
    calls = policy_book.recent_calls(200)
    assert sorted(c["journaled"] for c in calls) == sorted(journaled.values())
    assert {"allow", "ask", "deny"} <= set(journaled.values())
    assert sum(c["versioned"] for c in calls) == 1 and sum(bool(c["retry_of"]) for c in calls) == 1
    today = [policy_book.as_policy(row) for row in policy_book.current_policies()]
    assert policy_book.replay(today, calls) == [c["journaled"] for c in calls]
    result = policy_book.simulate_policy(draft=default)
    assert result["changed"] == 0
    assert {d: result["tally"][d]["count"] for d in policy.DECISIONS} == {
        d: sum(c["journaled"] == d for c in calls) for d in policy.DECISIONS}
    # The page says the same, for the Default policy as it is.
    client.force_login(admin_user)
    page = client.post(reverse("approver:policy_edit", args=[default.pk]), form_data(
        name=default.name, ask_timeout=1, simulate="1"), HTTP_HX_REQUEST="true").content.decode()
    counts = {d: sum(c["journaled"] == d for c in calls) for d in policy.DECISIONS}
    assert f"<strong>{counts['allow']}</strong> allowed" in page
    assert f"<strong>{counts['ask']}</strong> held for approval" in page
    assert "No recent call would be decided differently from today." in page
