"""Record leases between plans: from its first approval a plan holds each record it will change; another
plan's item on that record waits, is handed the record when it is released, and is checked again with the
server before anything is sent. Against the sample CRM, whose ledger says what really happened."""

import threading
from datetime import timedelta

import anyio
import pytest
from django.core import mail
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approver import notifications, services, tasks
from approver.models import Plan, PlanItem, RecordLease
from approver.services import leases
from journal import services as journal_services
from journal.models import Run
from samples import agent as scripted
from tests.journal.factories import make_run
from tests.journal.helpers import settle

from ..test_notifications import emails  # noqa: F401 - a fixture
from .test_approvals import approve, enrolled, relying_party, sign  # noqa: F401 - fixture and helpers
from .test_executor import ops, run_plan
from .test_overrides import page

pytestmark = pytest.mark.django_db(transaction=True)

DEAL = "crm://acme/deal/D-881"


@pytest.fixture
def rung(monkeypatch) -> list[int]:
    """The plans the worker is rung to execute (rung, not run: each test runs them)."""
    asked = []
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: asked.append(args[0]))
    return asked


@pytest.fixture
def two_plans(globex, recorder, dana, on_call) -> tuple[Plan, Plan]:
    """Two plans on deal D-881, checked: `holder` undoes ops-bot's later change to its amount, `waiter`
    sales-bot's Globex run from step 2 (the deal marked Won, the kickoff, the email)."""
    _, token = journal_services.create_agent(name="ops-bot", on_behalf_of=dana)
    story = [("crm__update_deal", {"deal_id": "D-881", "amount": 52000})]
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, run_id="raise-amount",
                                      say=lambda _: None, story=story))
    settle(recorder)
    raise_amount = Run.objects.get(key="run:raise-amount")
    plans = []
    for run, steps in ((raise_amount, [1]), (globex, [2])):
        plan = services.request_plan(run=run, requested_by=on_call, reason="wrong deal", steps=steps)
        plans.append(services.run_checks(plan=plan, check_round=plan.check_round))
    holder, waiter = plans
    assert holder.state == waiter.state == "ready" and services.conflict_positions(waiter) == {3}
    assert holder.items.get().record == waiter.items.get(position=3).record == DEAL
    return holder, waiter


def events(plan: Plan, name: str) -> list[dict]:
    """The plan's run's `name` entries about the deal."""
    return [e.data for e in plan.run.entries.filter(event=name).order_by("seq") if e.data["resource"] == DEAL]


def test_the_second_plan_waits_for_the_first_and_checks_the_record_again(
    two_plans, rung, sample_servers, approver_user, second_approver, on_call, emails, settings  # noqa: F811
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    holder, waiter = two_plans
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    approve(holder, approver_user, ana, choices={})  # one of two approvals: it holds the deal from now
    [held] = RecordLease.objects.held()
    assert (held.plan, held.server, held.resource) == (holder, "crm", DEAL) and held.until is not None
    on_deal = {"server": "crm", "resource": DEAL}
    assert events(holder, "lease_taken") == [{"plan": str(holder.public_id), **on_deal}]

    for user, key in ((approver_user, ana), (second_approver, bo)):
        approve(waiter, user, key)  # overwrite the newer change, for the reason WHY
    waiter.refresh_from_db()
    assert waiter.state == "approved"
    [waiting] = waiter.leases.open().filter(resource=DEAL)
    assert not waiting.is_held and waiting.waited
    told = {"plan": str(waiter.public_id), **on_deal, "otherPlan": str(holder.public_id)}
    assert events(waiter, "lease_waiting") == events(holder, "lease_waiting") == [told]  # both chains
    html = page(waiter, on_call)
    assert 'id="lease-wait-3"' in html and f"plan {str(holder.public_id)[:8]}</a>, which holds" in html
    assert "asked for by olivia, held since" in html and "if it is not executing then" in html
    assert 'class="break-lease"' not in html  # only an admin may break a lease
    api = Client()
    api.force_login(on_call)
    [line] = [lease for lease in api.get(reverse("api:plan_detail", args=[waiter.public_id])).json()[
        "leases"] if lease["resource"] == DEAL]
    assert (line["held"], line["heldBy"], line["since"]) == (False, str(holder.public_id), None)
    mail.outbox.clear()
    notifications.plan_ready(waiter)
    assert (f"Records other plans hold:\n- Step 2 waits for plan {str(holder.public_id)[:8]} (asked for by "
            f"olivia), which holds deal D-881.") in mail.outbox[0].body

    waiter = run_plan(waiter)  # the kickoff is undone; the deal waits for the holder
    assert waiter.state == "executing" and ops(sample_servers, "crm") == []
    outcomes = dict(waiter.items.values_list("position", "outcome"))
    assert outcomes == {1: "irreversible", 2: "compensated", 3: ""}
    assert "waiting for plan" in page(waiter, on_call)
    assert f"Waiting for it: <a href=\"{services.plan_url(waiter)}\">plan {str(waiter.public_id)[:8]}" \
        in page(holder, on_call)

    approve(holder, second_approver, bo, choices={})
    holder = run_plan(Plan.objects.get(pk=holder.pk))
    assert holder.state == "completed" and len(ops(sample_servers, "crm")) == 1
    # Released as it ended, and handed to the plan in line, which is rung.
    assert [lease.plan for lease in RecordLease.objects.held().filter(resource=DEAL)] == [waiter]
    assert waiter.pk in rung
    handed = {"plan": str(waiter.public_id), **on_deal, "otherPlan": str(holder.public_id)}
    assert events(waiter, "lease_taken") == events(holder, "lease_taken")[1:] == [handed]

    # The holder changed the deal: checked again, the waiter's overwrite of the version its approvers saw
    # would now overwrite the holder's undo, so nothing is sent.
    waiter = run_plan(Plan.objects.get(pk=waiter.pk))
    deal = waiter.items.get(position=3)
    assert deal.outcome == "conflict" and "Checked again after waiting" in deal.outcome_detail["message"]
    assert len(ops(sample_servers, "crm")) == 1 and waiter.state == "partially_completed"
    assert not RecordLease.objects.open().exists()
    assert [(e["plan"] == str(waiter.public_id), e["why"]) for e in events(waiter, "lease_released")] == [
        (False, "the plan ended"), (True, "the plan ended")]  # the holder's, handed on to it; then its own


def test_only_an_admin_breaks_a_lease_with_a_reason_and_the_next_plan_runs(
    two_plans, sample_servers, approver_user, second_approver, admin_user, on_call
):
    holder, waiter = two_plans
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    approve(holder, approver_user, ana, choices={})  # the holder never gets its second approval
    for user, key in ((approver_user, ana), (second_approver, bo)):
        approve(waiter, user, key)
    waiter = run_plan(waiter)
    lease = RecordLease.objects.held().get(resource=DEAL)
    url = reverse("approver:break_lease", args=[waiter.public_id, lease.pk])
    web = Client()
    web.force_login(approver_user)
    assert web.post(url, {"reason": "stuck"}).status_code == 403
    web.force_login(admin_user)
    assert 'class="break-lease"' in page(waiter, admin_user)
    # Issue 44, finding 9: the waiting plan names what can be done about it.
    assert ("What can be done: that plan's approvers may approve or reject it, its requester may cancel "
            "it, or an admin may break its lease, saying why.") in page(waiter, approver_user)
    assert web.post(url, {"reason": "  "}, follow=True).status_code == 200
    assert RecordLease.objects.held().get(resource=DEAL) == lease  # no reason, nothing broken
    assert web.post(url, {"reason": "Holder abandoned: its approver is away"}).status_code == 302
    lease.refresh_from_db()
    assert lease.released_at and lease.broken_by == admin_user and lease.released_why == "broken by ada"
    broken = {"plan": str(holder.public_id), "server": "crm", "resource": DEAL,
              "otherPlan": str(waiter.public_id), "why": "broken by ada",
              "held": True, "by": "ada", "reason": "Holder abandoned: its approver is away"}
    assert events(holder, "lease_released") == [broken] and broken in events(waiter, "lease_released")
    with pytest.raises(services.LeaseRefused, match="not held any more"):
        services.break_lease(lease=lease, by=admin_user, reason="again")
    # The holder's page says so at once, and what it means for its undo (it signed for the record as it was).
    said = page(holder, approver_user)
    assert 'id="lease-broken-1"' in said and "ada (an admin) broke this plan's lease on" in said
    assert "“Holder abandoned: its approver is away”" in said and "may end “left alone”" in said

    # Handed on and checked again: the deal is still at the version the waiter's approvers chose to overwrite.
    waiter = run_plan(Plan.objects.get(pk=waiter.pk))
    assert waiter.items.get(position=3).outcome == "compensated" and len(ops(sample_servers, "crm")) == 1


def test_leases_go_when_a_plan_is_cancelled_rejected_or_its_approvals_expire(
    two_plans, approver_user, second_approver, on_call
):
    holder, waiter = two_plans
    ana = enrolled(approver_user)
    approve(holder, approver_user, ana, choices={})
    approve(waiter, approver_user, ana)  # it holds the meeting's record, and waits for the deal
    assert [lease.plan for lease in RecordLease.objects.held().filter(resource=DEAL)] == [holder]
    services.cancel_plan(plan=holder, by=on_call)
    assert [lease.plan for lease in RecordLease.objects.held().filter(resource=DEAL)] == [waiter]  # handed on
    assert events(holder, "lease_released")[0]["why"] == "the plan was cancelled"

    RecordLease.objects.filter(plan=waiter).exclude(resource=DEAL).update(
        until=timezone.now() - timedelta(seconds=1))
    assert services.expire_leases() == 1
    assert waiter.leases.get(released_why="its approvals expired").resource.startswith("calendar://")

    request, assertion = sign(waiter, second_approver, enrolled(second_approver), decision="reject",
                              reason="not this one")
    services.complete_signing(user=second_approver, nonce=request.nonce, credential=assertion)
    assert not RecordLease.objects.open().exists()
    assert events(waiter, "lease_released")[-1]["why"] == "the plan was rejected"


def test_a_waiting_plan_aborted_ends_and_leaves_the_line(
    two_plans, rung, approver_user, second_approver
):
    holder, waiter = two_plans
    ana, bo = enrolled(approver_user), enrolled(second_approver)
    approve(holder, approver_user, ana, choices={})
    for user, key in ((approver_user, ana), (second_approver, bo)):
        approve(waiter, user, key)
    waiter = run_plan(waiter)
    assert waiter.state == "executing"
    rung.clear()
    assert services.abort_plan(plan=waiter, by=second_approver) and rung == [waiter.pk]  # rung to end it
    waiter = run_plan(Plan.objects.get(pk=waiter.pk))
    assert waiter.state == "partially_completed" and "Not started: Aborted by bo" in \
        waiter.items.get(position=3).outcome_detail["message"]
    assert [lease.plan for lease in RecordLease.objects.open()] == [holder]  # it left the line


@pytest.mark.postgres
def test_two_plans_approved_at_once_exactly_one_holds_the_record(dana, on_call):
    # Two plans whose items change the same record (no Recorder here: its server thread would keep a
    # database session open past the test, on PostgreSQL).
    agent, _ = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    runs = [make_run(agent, steps=1, run_key=f"run:{name}") for name in ("one", "two")]
    two = [services.request_plan(run=run, requested_by=on_call, reason="race", steps=[1]) for run in runs]
    PlanItem.objects.update(action="compensate", record=DEAL, exec_state="", conflict_choice="")
    barrier = threading.Barrier(2)
    crashed = []

    def first_approval(plan: Plan) -> None:
        try:
            barrier.wait(timeout=30)
            with transaction.atomic():
                leases.take(plan=plan, now=timezone.now())
        except Exception as exc:  # collected and asserted on in the main thread
            crashed.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=first_approval, args=(plan,)) for plan in two]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert crashed == []
    on_deal = RecordLease.objects.open().filter(resource=DEAL)
    assert on_deal.filter(held_since__isnull=False).count() == 1 and on_deal.count() == 2
    [line] = on_deal.filter(held_since__isnull=True)
    assert line.waited and line.plan in two


def test_a_lease_lapses_unless_its_plan_is_executing_however_it_was_approved(
    two_plans, approver_user, settings
):
    """Issue 43, finding 9: a plan approved by the autonomy policies held its leases forever once paused, and
    one approval of two held them for its 24 h. A lease now lapses `RECORD_LEASE_MINUTES` after it was
    asked for unless its plan is executing then; a plan that runs later asks again."""
    holder, waiter = two_plans
    now = timezone.now()
    approve(holder, approver_user, enrolled(approver_user), choices={})  # one approval of two
    [held] = RecordLease.objects.held()
    assert held.until <= timezone.now() + timedelta(minutes=settings.RECORD_LEASE_MINUTES)
    services.cancel_plan(plan=holder, by=approver_user)

    with transaction.atomic():
        leases.take(plan=waiter, now=now)  # as the policies approve a plan: no approval to expire
    assert {lease.until for lease in waiter.leases.open()} == {now + timedelta(minutes=60)}
    Plan.objects.filter(pk=waiter.pk).update(state=Plan.State.EXECUTING)
    assert services.expire_leases(now=now + timedelta(minutes=61)) == 0  # executing: it keeps them
    Plan.objects.filter(pk=waiter.pk).update(state=Plan.State.PAUSED)
    assert services.expire_leases(now=now + timedelta(minutes=59)) == 0
    assert services.expire_leases(now=now + timedelta(minutes=61)) == waiter.leases.count()
    assert not RecordLease.objects.open().exists()


def test_two_executing_plans_never_wait_for_each_other(dana, on_call, admin_user):
    """Issue 43, finding 9: an executing plan keeps its leases while it waits for another record, so two
    plans could each hold what the other waits for (here after an admin broke a lease), forever. The plan
    that would close the circle gives its record up to the other, asks for it again at the end of the line,
    and both chains say why."""
    agent, _ = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    first, second = [services.request_plan(run=make_run(agent, steps=2, run_key=f"run:{name}"),
                                           requested_by=on_call, reason="race", steps=[1, 2])
                     for name in ("one", "two")]
    other = "crm://acme/deal/D-882"
    for plan, records in ((first, (DEAL, other)), (second, (other, DEAL))):
        for item, record in zip(plan.items.order_by("position"), records, strict=True):
            PlanItem.objects.filter(pk=item.pk).update(action="compensate", record=record, exec_state="",
                                                       conflict_choice="")
    now = timezone.now()
    with transaction.atomic():
        leases.take(plan=first, now=now)  # it holds both records
        leases.take(plan=second, now=now + timedelta(seconds=1))  # and the second waits for both
    services.break_lease(lease=first.leases.held().get(resource=other), by=admin_user, reason="stuck")
    Plan.objects.filter(pk__in=[first.pk, second.pk]).update(state=Plan.State.EXECUTING)
    assert [lease.plan for lease in RecordLease.objects.held().filter(resource=other)] == [second]

    # The second plan's first item is on the other deal, which it now holds: it runs.
    assert leases.wait_for(plan=second, item=second.items.get(position=1), now=now) is None
    # Its second item waits for DEAL, which the first plan holds...
    holder = leases.wait_for(plan=second, item=second.items.get(position=2), now=now)
    assert holder.plan == first
    # ...and the first plan's second item wants the other deal back: waiting would close the circle.
    holder = leases.wait_for(plan=first, item=first.items.get(position=2), now=now)
    assert holder.plan == second
    held = {lease.resource: lease.plan for lease in RecordLease.objects.held()}
    assert held == {DEAL: second, other: second}  # given up to the second plan, which can finish
    assert leases.wait_for(plan=second, item=second.items.get(position=2), now=now) is None
    [given] = first.leases.filter(resource=DEAL, released_why__startswith="given up")
    why = f"given up to plan {str(second.public_id)[:8]}: the two plans waited for each other's records"
    assert given.released_why == why
    assert why in [e.data["why"] for e in second.run.entries.filter(event="lease_released")]
    [again] = first.leases.open().filter(resource=DEAL)
    assert not again.is_held and again.waited  # in line again, checked again before its item runs
    leases.release(plan=second, now=now, why="the plan ended")
    assert {lease.resource for lease in first.leases.held()} == {DEAL, other}
