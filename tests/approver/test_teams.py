"""Teams own agents: a person sees, plans and signs only for their teams' agents (admins see every team's);
a plan's approvers are its agent's team's, counted under the team's own approval rules; a policy may cover
one team's agents; and a person taken out of a team loses it at their next request. The Globex story runs
through the real Recorder and sample servers; the pages are read as each person sees them."""

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from approver import authority, notifications, policy, policy_book, services, tasks
from approver.models import ActionRequest, ApprovalRules, AutonomyPolicy, Plan
from journal import services as journal_services
from journal.auth import roles
from journal.models import Agent, Run, Step, Team

from .services.test_approvals import enrolled, relying_party, sign  # noqa: F401 - fixture
from .services.test_held_calls import EMAIL, call

pytestmark = pytest.mark.django_db(transaction=True)


def person(username: str, role: str, team: Team | None = None, email: str = "") -> User:
    user = User.objects.create_user(username=username, email=email or f"{username}@acme.example")
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    if team is not None:
        team.members.add(user)
    return user


@pytest.fixture
def two_teams(globex, on_call, approver_user, second_approver, settings):
    """Globex's sales-bot moved to team payments (Olivia on call, Ana and Bo approve); team search has its
    own on-call and approver, and the upgrade's one team no longer counts everyone."""
    Team.objects.filter(name=settings.DEFAULT_TEAM).update(everyone=False)
    payments, search = Team.objects.create(name="payments"), Team.objects.create(name="search")
    payments.members.add(on_call, approver_user, second_approver)
    for user in (on_call, approver_user, second_approver):
        user.email = f"{user.username}@acme.example"
        user.save()
    moved = journal_services.move_agent(agent=Agent.objects.get(name="sales-bot"), team=payments)
    assert moved == 1 and Run.objects.get(pk=globex.pk).team == payments
    return payments, search, person("sid", roles.ON_CALL, search), person("sam", roles.APPROVER, search)


@pytest.fixture
def ready_plan(two_teams, globex, on_call) -> Plan:
    plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong deal", from_step=2)
    plan = services.run_checks(plan=plan, check_round=plan.check_round)
    assert plan.state == Plan.State.READY
    return plan


def seen_by(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_each_team_sees_plans_and_signs_only_its_own_agents(ready_plan, two_teams, globex, approver_user,
                                                            second_approver, admin_user):
    _, _, sid, sam = two_teams
    plan_url = reverse("approver:plan_detail", args=[ready_plan.public_id])
    run_url = reverse("journal:run_detail", args=[globex.public_id])
    # Search's people: no such plan, no such run, nothing in the lists, nothing to sign, no email.
    for outsider in (sid, sam):
        browser = seen_by(outsider)
        assert browser.get(plan_url).status_code == 404 and browser.get(run_url).status_code == 404
        assert "No such plan" in browser.get(plan_url).content.decode()
        assert str(ready_plan.public_id) not in browser.get(reverse("approver:plan_list")).content.decode()
        api = reverse("api:plan_detail", args=[ready_plan.public_id])
        assert browser.get(api).status_code == 404
    refused = Client()
    refused.force_login(sam)
    begin = refused.post(reverse("approver:sign_begin", args=[ready_plan.public_id]),
                         {"decision": "approve", "choices": {}}, content_type="application/json")
    assert begin.status_code == 404
    assert "of the team payments may approve" in authority.signing_refusal(plan=ready_plan, user=sam)
    assert authority.waiting_for(sam, limit=10) == ([], False)
    # Payments' approvers are the plan's, and only they are emailed.
    assert [u.username for u in authority.who_may_sign(ready_plan)] == ["ana", "bo"]
    assert sorted(u.username for u in notifications.approvers_to_tell(ready_plan)) == ["ana", "bo"]
    mail.outbox.clear()
    notifications.plan_ready(ready_plan)
    assert [sorted(m.to) for m in mail.outbox] == [["ana@acme.example", "bo@acme.example"]]
    assert [p.pk for p in authority.waiting_for(approver_user, limit=10)[0]] == [ready_plan.pk]
    # An admin sees every team's plans, and signs for none she is not in.
    admin_page = seen_by(admin_user).get(plan_url)
    assert admin_page.status_code == 200
    assert seen_by(approver_user).get(plan_url).status_code == 200


def test_a_teams_own_rules_count_its_plans_approvals_and_a_removed_approver_stops_counting(
        ready_plan, two_teams, approver_user, second_approver, admin_user, sample_servers):
    payments, search, _, _ = two_teams
    shared = services.save_approval_rules(rules=ApprovalRules(quorum=2), by=admin_user)
    services.save_approval_rules(rules=ApprovalRules(team=payments, quorum=1, valid_for=timedelta(hours=1)),
                                 by=admin_user)
    assert ApprovalRules.of_plan(ready_plan).quorum == 1 and ApprovalRules.current(search.pk) == shared
    key = enrolled(approver_user)
    request, assertion = sign(ready_plan, approver_user, key, choices={})
    approval = services.complete_signing(user=approver_user, nonce=request.nonce, credential=assertion)
    ready_plan.refresh_from_db()
    # One signature is the payments quorum (the shared rules would want two), valid for the team's hour.
    assert ready_plan.state == Plan.State.APPROVED
    assert approval.expires_at - approval.created_at == timedelta(hours=1)
    assert [a.pk for a in authority.counting_approvals(plan=ready_plan)] == [approval.pk]
    # Ana leaves payments: at once her signature counts for nothing, and the plan may not run on it.
    payments.members.remove(approver_user)
    ana = User.objects.get(pk=approver_user.pk)  # as her next request reads her
    assert authority.counting_approvals(plan=ready_plan) == []
    assert "you are not in it" in authority.signing_refusal(plan=ready_plan, user=ana)
    assert seen_by(ana).get(reverse("approver:plan_detail", args=[ready_plan.public_id])).status_code == 404
    stopped = services.execute_plan(plan=ready_plan)
    assert stopped.state == Plan.State.FAILED
    assert stopped.execution_summary == "Reversed 0 of 3 actions; 3 skipped"
    assert all("0 of the 1 approvals needed still hold" in item.outcome_detail["message"]
               for item in stopped.items.all())
    assert [e["op"] for e in sample_servers.ledger("crm")] == ["update_deal"]  # the agent's, never undone


def test_a_policy_covers_one_teams_agents_and_its_held_calls_are_that_teams_to_decide(
        two_teams, recorder, admin_user, approver_user, dana, monkeypatch):
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    payments, search, sid, sam = two_teams
    services.save_policy(row=AutonomyPolicy(
        name="Payments asks", scope="team", team=payments, ask_timeout=1,
        decisions={**policy.DEFAULT_DECISIONS, "none": "ask"}), by=admin_user)
    _, pay_token = journal_services.create_agent(name="pay-bot", on_behalf_of=dana, team=payments)
    _, search_token = journal_services.create_agent(name="search-bot", on_behalf_of=dana, team=search)
    call(recorder, pay_token, "mail__send_email", EMAIL)
    passed = call(recorder, search_token, "mail__send_email", EMAIL)
    decided = {s.run.agent.name: s.policy_decision for s in Step.objects.filter(tool="send_email")}
    assert decided["pay-bot"]["decision"] == "ask"
    assert "team payments's agents" in decided["pay-bot"]["reason"]
    assert decided["search-bot"]["decision"] == "allow" and not passed.is_error
    action = ActionRequest.objects.get()
    action_url = reverse("approver:action_detail", args=[action.public_id])
    assert seen_by(sam).get(action_url).status_code == 404
    assert "of the team payments decide" in authority.action_refusal(action=action, user=sam)
    assert not authority.action_refusal(action=action, user=approver_user)
    assert seen_by(approver_user).get(action_url).status_code == 200
    # The simulator reads each call with its agent's team, as the Recorder did.
    today = [services.as_policy(row) for row in services.current_policies()]
    calls = [c for c in policy_book.recent_calls(50) if c["agent"] in ("pay-bot", "search-bot")]
    assert policy_book.replay(today, calls) == [c["journaled"] for c in calls]


def test_an_undo_since_and_the_agents_page_cover_only_agents_the_asker_may_see(two_teams, globex, on_call):
    _, _, sid, _ = two_teams
    since = {"since": "2026-01-01T00:00", "reason": "r"}
    refused = seen_by(sid).post(reverse("approver:undo_since", args=["sales-bot"]), since)
    assert refused.status_code == 404 and not Plan.objects.exists()
    assert seen_by(sid).get(reverse("journal:agent_detail", args=["sales-bot"])).status_code == 404
    asked = seen_by(on_call).post(reverse("approver:undo_since", args=["sales-bot"]), since)
    assert asked.status_code == 302 and Plan.objects.get().run.team.name == "payments"


def test_the_upgrade_puts_every_agent_and_run_in_one_team_that_counts_everyone(globex, on_call, settings):
    team = Team.objects.get(name=settings.DEFAULT_TEAM)
    assert team.everyone and not team.members.exists()
    assert set(Run.objects.values_list("team", flat=True)) == {team.pk}
    assert Agent.objects.get(name="sales-bot").team == team
    assert seen_by(on_call).get(reverse("journal:run_detail", args=[globex.public_id])).status_code == 200


def test_the_undo_command_asks_only_for_the_askers_teams(two_teams, globex, on_call):
    _, _, sid, _ = two_teams
    sid.groups.add(Group.objects.get(name=roles.ON_CALL))
    with pytest.raises(CommandError, match="not in the team payments, whose run this is"):
        call_command("undo", str(globex.public_id), "--from-step", "2", "--as", "sid")
    with pytest.raises(CommandError, match="not in the team payments, whose agent this is"):
        call_command("undo", agent="sales-bot", since="2026-01-01T00:00:00+00:00", reason="r", username="sid")
    assert not Plan.objects.exists()
    out = io.StringIO()
    call_command("undo", str(globex.public_id), "--from-step", "2", "--as", on_call.username, stdout=out)
    assert Plan.objects.get().requested_by == on_call


def test_a_new_agent_joins_the_team_named_else_its_persons_one_team_else_the_default(two_teams, dana,
                                                                                    settings):
    payments, search, _, _ = two_teams
    out = io.StringIO()
    call_command("create_agent", "ledger-bot", "--on-behalf-of", "dana", "--team", "search", stdout=out)
    assert Agent.objects.get(name="ledger-bot").team == search and "in team search" in out.getvalue()
    with pytest.raises(CommandError, match="No team is named 'nobody'"):
        call_command("create_agent", "x-bot", "--on-behalf-of", "dana", "--team", "nobody")
    assert journal_services.create_agent(name="a-bot", on_behalf_of=dana)[0].team.name == "everyone"
    payments.members.add(dana)
    assert journal_services.create_agent(name="b-bot", on_behalf_of=dana)[0].team == payments
    search.members.add(dana)  # in two: nobody can tell which, so the default
    assert journal_services.create_agent(name="c-bot", on_behalf_of=dana)[0].team.name == "everyone"


def test_an_admin_moves_an_agent_to_another_team_in_the_admin_and_its_runs_go_with_it(two_teams, globex):
    payments, search, _, _ = two_teams
    root = User.objects.create_superuser("root", password="root-password-1")
    admin_site = Client()
    admin_site.force_login(root)
    agent = Agent.objects.get(name="sales-bot")
    page = admin_site.get(f"/admin/journal/agent/{agent.pk}/change/")
    assert page.status_code == 200
    moved = admin_site.post(f"/admin/journal/agent/{agent.pk}/change/", {
        "team": search.pk, "is_active": "on", "asks_approvers": "on", "runs_by": agent.runs_by}, follow=True)
    assert "now belong to search" in moved.content.decode()
    assert Agent.objects.get(pk=agent.pk).team == search
    assert set(Run.objects.filter(agent=agent).values_list("team__name", flat=True)) == {"search"}
