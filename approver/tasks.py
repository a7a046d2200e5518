"""Thin Celery entry points for the approval side."""

from datetime import timedelta

from celery import shared_task
from celery.signals import worker_process_shutdown, worker_shutdown
from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from journal.telemetry import metrics, tracing

from . import notifications, services, traced
from .models import ActionRequest, Plan
from .services import webhooks

# How long past its expected end a job is given before the periodic tasks treat it as left by a dead worker
# (or, for a held call, a lost bell).
GRACE_SECONDS = 60


def stalled_before():
    """A check that has not moved for this long was left by a worker that died."""
    return timezone.now() - timedelta(seconds=2 * settings.TOOL_SERVER_TIMEOUT + GRACE_SECONDS)


@shared_task(name="approver.draft_plan")
def draft_plan(plan_id: int) -> str:
    """Draft a requested plan: read the run, write the items, queue the checks. Safe to run twice: one worker
    drafts a plan at a time, and a draft a dead worker left is started again."""
    plan = Plan.objects.filter(pk=plan_id).select_related("run").first()
    if plan is None:
        return "no such plan"
    with traced.plan_span(plan, "plan draft"):
        return services.draft_plan(plan=plan).state


@shared_task(name="approver.check_plan")
def check_plan(plan_id: int, check_round: int) -> str:
    """Check a plan's pending items against their tool servers, for one round of checks. Safe to run
    twice: answered items are not asked again, and a task for an old round does nothing."""
    plan = Plan.objects.filter(pk=plan_id).select_related("run", "requested_by").first()
    if plan is None:
        return "no such plan"
    with traced.plan_span(plan, "plan checks", **{"undo.plan.check_round": check_round}):
        checked = services.run_checks(plan=plan, check_round=check_round)
    return checked.state if checked is not None else "moved on"


@shared_task(name="approver.requeue_stalled_checks")
def requeue_stalled_checks() -> int:
    """Ring the bell again for drafts and checks a dead worker left half done (or whose bell was lost)."""
    stalled = list(Plan.objects.filter(state=Plan.State.CHECKING, updated_at__lt=stalled_before())
                   .values_list("pk", "check_round"))
    for plan_id, check_round in stalled:
        check_plan.delay(plan_id, check_round)
    drafts = list(
        Plan.objects.filter(
            state=Plan.State.DRAFTING, updated_at__lt=timezone.now() - services.DRAFT_STALE
        ).values_list("pk", flat=True)
    )
    for plan_id in drafts:
        draft_plan.delay(plan_id)
    return len(stalled) + len(drafts)


@shared_task(name="approver.notify_plan_ready")
def notify_plan_ready(plan_id: int, check_round: int) -> int:
    """Tell the approvers a plan is ready. Safe to run twice: the round is claimed before anything is sent.
    A saga's plan is told in a batch (`notify_saga_plans`)."""
    if Plan.objects.filter(pk=plan_id, saga=True).exists():
        return notify_saga_plans()
    with transaction.atomic():  # the claim and the webhooks' delivery are kept together, or neither is
        if not Plan.objects.filter(pk=plan_id, state=Plan.State.READY, check_round=check_round,
                                   ready_notified_round__lt=check_round).update(
                ready_notified_round=check_round, ready_notified_at=timezone.now()):
            return 0
        plan = Plan.objects.for_page().get(pk=plan_id)
        notifications.plan_event("plan.ready", plan)
    return notifications.plan_ready(plan)


@shared_task(name="approver.notify_saga_plans")
def notify_saga_plans() -> int:
    """Tell the approvers, in one message, of every plan a saga policy opened that is ready and not yet
    told; at most once every SAGA_NOTIFY_MINUTES (beat runs this each minute for what waited), so a flood of
    failed calls is one message, not one each. Safe to run twice: each plan's round is claimed first."""
    now = timezone.now()
    last = Plan.objects.filter(saga=True).aggregate(last=Max("ready_notified_at"))["last"]
    if last is not None and now - last < timedelta(minutes=settings.SAGA_NOTIFY_MINUTES):
        return 0
    with transaction.atomic():
        ready = Plan.objects.filter(saga=True, state=Plan.State.READY,
                                    ready_notified_round__lt=F("check_round")).order_by("created_at")
        claimed = [pk for pk, check_round in ready.values_list("pk", "check_round")
                   if Plan.objects.filter(pk=pk, check_round=check_round,
                                          ready_notified_round__lt=check_round)
                   .update(ready_notified_round=check_round, ready_notified_at=now)]
        plans = list(Plan.objects.for_page().filter(pk__in=claimed).order_by("created_at"))
        for plan in plans:
            notifications.plan_event("plan.ready", plan)
    return notifications.saga_plans_ready(plans) if plans else 0


@shared_task(name="approver.notify_plan_decided")
def notify_plan_decided(plan_id: int) -> int:
    """Tell the requester how the plan was decided. Safe to run twice."""
    # Execution may have started (or finished) before this task runs: any state after the decision counts.
    with transaction.atomic():
        if not Plan.objects.filter(pk=plan_id, state__in=Plan.DECIDED_STATES, outcome_notified=False).update(
                outcome_notified=True):
            return 0
        plan = Plan.objects.for_page().get(pk=plan_id)
        notifications.plan_event("plan.rejected" if plan.state == Plan.State.REJECTED else "plan.approved",
                                 plan)
    return notifications.plan_decided(plan)


@shared_task(name="approver.execute_plan")
def execute_plan(plan_id: int) -> str:
    """Run an approved plan. Safe to run twice: every item is claimed with a conditional update. After a
    failure that is safe to repeat it asks to be rung again when the backoff is over."""
    plan = Plan.objects.filter(pk=plan_id).select_related("run").first()
    if plan is None:
        return "no such plan"
    with traced.plan_span(plan, "plan execution"):
        return services.execute_plan(plan=plan).state


@shared_task(name="approver.reconcile_execution")
def reconcile_execution() -> int:
    """Ring again for plans a killed worker left mid-way (see `services.reconcile_execution`)."""
    horizon = timezone.now() - timedelta(seconds=4 * settings.TOOL_SERVER_TIMEOUT + GRACE_SECONDS)
    services.expire_leases()  # approvals that took a lease and expired: the record goes to the next plan
    plans = services.reconcile_execution(older_than=horizon)
    for plan_id in plans:
        execute_plan.delay(plan_id)
    return len(plans)


@shared_task(name="approver.notify_plan_executed")
def notify_plan_executed(plan_id: int) -> int:
    """Tell the requester and the approvers how the plan ran. Safe to run twice."""
    with transaction.atomic():
        if not Plan.objects.filter(pk=plan_id, execution_notified=False).exclude(execution_summary="").update(
                execution_notified=True):
            return 0
        plan = Plan.objects.for_page().get(pk=plan_id)
        notifications.plan_event("plan.finished", plan, result=plan.execution_summary,
                                 stopped=plan.stop_reason or None)
    return notifications.plan_executed(plan)


@shared_task(name="approver.deliver_webhook")
def deliver_webhook(delivery_id: int) -> str:
    """Send one webhook delivery if it is due (`services.webhooks.deliver`); safe to run twice."""
    return webhooks.deliver(delivery_id)


@shared_task(name="approver.sweep_webhooks")
def sweep_webhooks() -> int:
    """Ring again for webhook deliveries that are due and nobody is sending."""
    return webhooks.sweep()


@shared_task(name="approver.notify_action_requested")
def notify_action_requested(action_id: int) -> int:
    """Tell the approvers a call is held for them, with every other held call nobody was told of yet, in
    one message, at most once every HELD_CALL_NOTIFY_MINUTES (beat rings again each minute for what
    waited): a flood of held calls is one message, not one each. Safe to run twice: each request is claimed
    first. Returns how many were emailed."""
    now = timezone.now()
    last = ActionRequest.objects.aggregate(last=Max("notified_at"))["last"]
    if last is not None and now - last < timedelta(minutes=settings.HELD_CALL_NOTIFY_MINUTES):
        return 0
    untold = ActionRequest.objects.filter(state=ActionRequest.State.PENDING, notified=False)
    with transaction.atomic():
        claimed = [pk for pk in untold.order_by("created_at").values_list("pk", flat=True)
                   if untold.filter(pk=pk).update(notified=True, notified_at=now)]
        actions = list(ActionRequest.objects.select_related("agent__on_behalf_of", "agent__team", "server")
                       .filter(pk__in=claimed).order_by("created_at"))
        for action in actions:
            notifications.held_call_event(action)
    return notifications.held_calls_requested(actions) if actions else 0


@shared_task(name="approver.expire_held_calls")
def expire_held_calls() -> int:
    """Close held-call requests past their time, and ring again for approvers never told of one (a broker
    that was down when it was held). Safe to run twice."""
    untold = ActionRequest.objects.filter(state=ActionRequest.State.PENDING, notified=False,
                                          created_at__lt=timezone.now() - timedelta(seconds=GRACE_SECONDS))
    for action_id in untold.values_list("pk", flat=True):
        notify_action_requested.delay(action_id)
    return services.expire_held_calls()


@shared_task(name="approver.retry_notice")
def retry_notice(channel: str, message: dict, about: str, attempt: int) -> bool:
    """Try once more a notification whose channel failed (`notifications.email`, `notifications.webhook`)."""
    return notifications.retry(channel, message, about, attempt)


@worker_process_shutdown.connect
@worker_shutdown.connect
def _stopping(**kwargs) -> None:
    """A worker (or one of its children) stops: its live gauges go, and its last spans are sent."""
    metrics.process_ended()
    tracing.flush()
