"""Reversal plans: asking for one, its page (what will be undone, what cannot, what changed since), and
the buttons that check, cancel, pause, resume or abort it."""

from django.contrib import messages
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRefresh

from journal.auth import roles
from journal.auth.access import READERS, require_role, visible_agent, visible_run
from journal.models import ToolServer
from journal.undo.recipe_text import brief, record_name

from .. import authority, execution, planning, sentence, services, signing
from ..forms import UndoRequestForm, UndoSinceForm
from ..models import Approval, ApprovalRules, Plan, PlanItem, RecordLease
from ..services import checking

PLANS_PER_PAGE = 25


@require_POST
def request_undo(request, run_id):
    """On-call asks to undo a run from step N, or the steps they ticked: the plan is opened at once, and the
    worker drafts it and checks it while the plan page shows how far it got."""
    require_role(request, roles.ON_CALL)
    run = visible_run(request, run_id)
    form = UndoRequestForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, error)
        return redirect(reverse("journal:run_detail", args=[run.public_id]))
    try:
        plan = services.ask_for_plan(run=run, requested_by=request.user, reason=form.cleaned_data["reason"],
                                     from_step=form.cleaned_data["from_step"],
                                     steps=form.cleaned_data["steps"] or None)
    except services.PlanRefused as refused:
        messages.error(request, refused.message)
        target = services.plan_url(refused.open_plan) if refused.open_plan else reverse(
            "journal:run_detail", args=[run.public_id])
        return redirect(target)
    messages.success(
        request,
        f"Plan asked for: undo {plan.selection_text}. The worker drafts it, then checks every "
        "step with the tool servers.",
    )
    return redirect(services.plan_url(plan))


@require_POST
def undo_since(request, name):
    """On-call asks to undo everything an agent did since a moment, across its runs ("everything sales-bot
    did since 03:10"): one plan, drafted and checked by the worker like a run's."""
    require_role(request, roles.ON_CALL)
    agent = visible_agent(request, name)
    back = reverse("journal:agent_detail", args=[agent.name])
    form = UndoSinceForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, error)
        return redirect(back)
    try:
        plan = services.ask_to_undo_since(agent=agent, since=form.cleaned_data["since"],
                                          requested_by=request.user, reason=form.cleaned_data["reason"])
    except services.PlanRefused as refused:
        messages.error(request, refused.message)
        return redirect(services.plan_url(refused.open_plan) if refused.open_plan else back)
    messages.success(request, f"Plan asked for: undo what {agent.name} did {plan.selection_text}, in every "
                              "run. The worker drafts it, then checks every step with the tool servers.")
    return redirect(services.plan_url(plan))


@require_POST
def plan_rest(request, plan_id):
    """Plan the rest of a plan that stopped short: a new plan for what it did not undo, linked both ways,
    drafted and checked by the worker, its approvers told when it is ready."""
    require_role(request, *authority.MAY_PLAN_REST)
    plan = authority.visible_plan(request, plan_id)
    try:
        rest = services.plan_the_rest(plan=plan, requested_by=request.user)
    except services.PlanRefused as refused:
        messages.error(request, refused.message)
        return redirect(services.plan_url(refused.open_plan or plan))
    messages.success(request, f"The rest of plan {str(plan.public_id)[:8]} is planned: the worker drafts it, "
                              "then checks every step with the tool servers.")
    return redirect(services.plan_url(rest))


@require_POST
def break_lease(request, plan_id, lease_id):
    """An admin breaks a plan's lease on a record, saying why: the next plan in line gets the record."""
    require_role(request, roles.ADMIN)
    plan = authority.visible_plan(request, plan_id)
    lease = get_object_or_404(RecordLease, pk=lease_id)
    try:
        services.break_lease(lease=lease, by=request.user, reason=request.POST.get("reason", ""))
    except services.LeaseRefused as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, f"Lease broken: plan {str(lease.plan.public_id)[:8]} no longer holds "
                                  f"{lease.resource}. The next plan in line checks it again before it runs.")
    return redirect(services.plan_url(plan))


@require_GET
def plan_list(request):
    require_role(request, *READERS)
    if request.GET.get("waiting") == "me":  # what waits for this approver's signature, all on one page
        mine, _ = authority.waiting_for(request.user, limit=PLANS_PER_PAGE * 4)
        ids = [plan.pk for plan in mine]
        plans = authority.visible_plans(request.user, Plan.objects.for_page()).filter(pk__in=ids).order_by(
            "-created_at", "-id")
        return render(request, "approver/plan_list.html", {"page": list(plans), "waiting": True})
    plans = authority.visible_plans(request.user, Plan.objects.for_page()).order_by("-created_at", "-id")
    page = Paginator(plans, PLANS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "approver/plan_list.html", {"page": page})


@require_GET
def plan_detail(request, plan_id):
    require_role(request, *READERS)
    plan = authority.visible_plan(request, plan_id, Plan.objects.for_page())
    was = request.GET.get("was")
    if request.htmx and was and was != plan.state:
        # Drafted, checked, started or finished: the whole page changes (its heading, its controls at the
        # top), not only the fragment.
        return HttpResponseClientRefresh()
    template = "approver/plan_detail.html#checks" if request.htmx else "approver/plan_detail.html"
    return render(request, template, _plan_context(request, plan))


def _plan_context(request, plan: Plan) -> dict:
    items = _name_recipes(list(services.items_for_page(plan)))
    services.leases_for_page(plan, items)
    runs = list(plan.runs.order_by("started_at", "pk")) if plan.since else []
    for item in items:  # across runs, "step 3" says of which run
        begun = timezone.localtime(item.step.run.started_at)
        item.in_run = f" of the run begun {begun:%b %-d, %H:%M:%S %Z}" if plan.since else ""
    by_action = {action: [i for i in items if i.action == action] for action in PlanItem.Action.values}
    compensate = by_action[PlanItem.Action.COMPENSATE]
    return {
        "plan": plan,
        "runs": runs,
        # What will be undone under the current choices, decided as the executor decides it; an undo the
        # approvers chose to skip is left alone.
        "undo": [i for i in compensate
                 if execution.intent(i.action, i.conflict_choice, i.dialect) == execution.UNDO],
        "left_alone": [i for i in compensate
                       if execution.intent(i.action, i.conflict_choice, i.dialect) == execution.LEAVE],
        # Undos whose check found the record as the agent left it: unchanged since, as far as can be told.
        "unchanged": sum(i.check_status == PlanItem.Check.OK for i in compensate),
        "cannot": by_action[PlanItem.Action.CANNOT_UNDO],
        "nothing": by_action[PlanItem.Action.NOTHING_TO_UNDO],
        "already": by_action[PlanItem.Action.ALREADY_UNDONE],
        "changed": [i for i in items if i.check_status == PlanItem.Check.CONFLICT],
        # Steps with no version to compare: whether they changed since cannot be told, and the page says so.
        "unversioned": [i.step.number for i in items if not i.step.effect_version and i.action in (
            PlanItem.Action.COMPENSATE, PlanItem.Action.CANNOT_UNDO)],
        "now": timezone.now(),
        **authority.plan_buttons(request.user, plan),
        "may_break_lease": roles.has_role(request.user, roles.ADMIN),
        "report": _report(plan, items),
        "overrides": [i for i in items if i.override_reason],
        "short_digest": planning.short_digest(plan.digest),
        "since_message": _since_message(plan, planning.seen_digest(request.GET.get("digest"))),
        **(sign_off := _sign_off_context(request, plan, items)),
        "sentence": _sentence(plan, items, may_sign=sign_off["may_sign"]),
    }


def _sentence(plan: Plan, items: list[PlanItem], *, may_sign: bool) -> str:
    """What signing does, in one sentence (approver.sentence): the top of the page, the sign button, the
    approvers' email and the plan's JSON read the same function, which the executor decides with."""
    if not plan.digest or plan.state in (Plan.State.DRAFTING, Plan.State.CHECKING):
        return ""
    return sentence.of_items(items).text(sentence.lead(plan.state, may_sign=may_sign))


def _name_recipes(items: list[PlanItem]) -> list[PlanItem]:
    """Each recipe undo with the recipe behind it (`item.recipe`): what it does, the pack it came from, who
    put the server's recipes in force and when, and the call in one line."""
    servers = ToolServer.objects.in_bulk({i.step.server_id for i in items if i.dialect == "recipe"})
    for item in items:
        server = servers.get(item.step.server_id) if item.dialect == "recipe" else None
        if server is None:
            continue
        recipe = server.recipe(item.step.tool) or {}
        item.recipe = {"does": recipe.get("does") or "", "pack": server.recipe_pack,
                       "by": server.recipes_changed_by, "at": server.recipes_changed_at,
                       "call": ", then ".join(brief(call["tool"], call["arguments"]) for call in [
                           {"tool": item.tool, "arguments": item.arguments or {}}, *(item.then or [])])}
    return items


def _since_message(plan: Plan, seen: str) -> dict | None:
    """Opened from a message whose plan has changed since (its link's digest is not the plan's): what changed,
    where the message's content was kept, else just that it changed."""
    if not seen or plan.digest.startswith(seen):
        return None
    kept = plan.messaged_digest.startswith(seen) and plan.messaged_content
    return {"seen": planning.short_digest(seen), "changes": signing.content_changes(
        plan.messaged_content, services.plan_content(plan)) if kept else []}


def _report(plan: Plan, items: list) -> dict | None:
    if plan.state not in (Plan.State.EXECUTING, Plan.State.PAUSED, *Plan.FINISHED_STATES):
        return None
    finished = plan.state in Plan.FINISHED_STATES
    undos = [i for i in items if i.action == PlanItem.Action.COMPENSATE]
    return {
        # Executing, and its next item waits for another plan's lease on its record.
        "waits": next((i for i in items if i.exec_state == PlanItem.Exec.NOT_STARTED and getattr(
            i, "held_by", None)), None) if plan.state == Plan.State.EXECUTING else None,
        # What it did not undo, where that went, or why there is no rest to plan now.
        "left": [i for i in items if i.action == PlanItem.Action.COMPENSATE and i.outcome
                 and i.outcome != execution.COMPENSATED] if finished else [],
        "rest_plan": services.live_rest(plan) if finished else None,
        "rest_refusal": services.rest_refusal(plan) if finished else "",
        # The same count of actions as the title and the summary: the undos it set out to make.
        "done": sum(i.exec_state == PlanItem.Exec.DONE for i in undos), "total": len(undos),
        **_report_lists(plan, items)}


def _report_lists(plan: Plan, items: list) -> dict:
    """What the report lists: to do by hand, the overrides and who signed them."""
    return {"to_do": [i for i in items if i.outcome in execution.NEEDS_A_HUMAN],
            "overrides": [i for i in items if i.override_reason],
            "signers": sorted({a.approver.get_username() for a in plan.approvals.filter(
                decision=Approval.Decision.APPROVE, digest=plan.digest).select_related("approver")})}


def _sign_off_context(request, plan: Plan, items: list) -> dict:
    """Who signed what, what counts, whether the approvers signed different choices (then the plan cannot
    run as it stands), and whether this user may sign now (and if not, why)."""
    rules = ApprovalRules.of_plan(plan)
    approvals = list(plan.approvals.select_related("approver", "passkey").order_by("created_at"))
    counting = {a.pk for a in authority.counting_approvals(plan=plan, rules=rules)}
    current = services.plan_content(plan) if any(a.digest != plan.digest for a in approvals) else None
    signed = [
        {
            "approval": a,
            "counts": a.pk in counting,
            "changes": signing.content_changes(a.content, current)
            if current and a.digest != plan.digest
            else [],
        }
        for a in approvals
    ]
    counted_by = {a.approver_id for a in approvals if a.pk in counting}
    names = [u.get_username() for u in authority.who_may_sign(plan, rules) if u.pk not in counted_by] \
        if plan.state == Plan.State.READY else []
    still_needed = max(rules.quorum - len(counting), 0)

    mine = next((a for a in approvals if a.pk in counting and a.approver_id == request.user.pk), None)

    def refusal() -> str:  # an approver whose approval counts is told so, and what is still needed
        return authority.signing_refusal(plan=plan, user=request.user, rules=rules) or (
            authority.signed_words(mine, still_needed=still_needed, names=names, chose=_chose(mine, items))
            if mine else "")

    return {"rules": rules, "signed": signed, "counting": len(counting),
            "choices_differ": _choices_differ(plan, items, approvals),
            "still_needed": still_needed, "may_sign_names": names,
            # A plan that ended with nothing left to undo was never anyone's to sign (services.nothing_left).
            "nothing_to_sign": plan.state in Plan.FINISHED_STATES and not approvals
            and not plan.approved_by_policy,
            **authority.signing_state(request.user, role=roles.APPROVER,
                                      refusal=refusal if plan.state == Plan.State.READY else None)}


def _chose(approval: Approval, items: list) -> list[str]:
    """An approval's choices on the records changed since, in words: "deal D-881: undo it anyway"."""
    by_position = {str(i.position): i for i in items}
    return [f"{record_name(item.step.effect_resource or item.record) or f'step {item.step.number}'}: "
            f"{signing.CHOICE_WORDS.get(choice, choice)}"
            for position, choice in sorted((approval.choices or {}).items())
            if (item := by_position.get(position)) is not None]


def _choices_differ(plan: Plan, items: list, approvals: list[Approval]) -> bool:
    """Whether an approver signed other choices or override reasons than the plan now holds (then it
    cannot run as it stands)."""
    chosen = ({str(i.position): i.conflict_choice for i in items if i.conflict_choice},
              {str(i.position): i.override_reason for i in items if i.override_reason})
    return any(a.decision == Approval.Decision.APPROVE and a.digest != plan.digest
               and (a.choices, a.overrides) != chosen for a in approvals)


@require_POST
def check_again(request, plan_id):
    require_role(request, *authority.MAY_CHECK)
    plan = authority.visible_plan(request, plan_id)
    done = checking.check_again(plan=plan, by=request.user)
    if done == "redrafted":
        messages.success(request, "A call this plan was drafted on while it was held for approval has moved "
                                  "on since: the plan is drafted again from the record, then checked.")
    elif done == "checking":
        messages.success(request, "Checking again with the tool servers.")
    else:
        messages.error(request, f"This plan is {plan.get_state_display().lower()}; it cannot be checked now.")
    return redirect(services.plan_url(plan))


def _plan_action(request, plan_id, name: str, action):
    """A state change on one plan by the signed-in user (`authority.CONTROLS[name]`: who may, and what is
    said); the service says whether the plan allowed it."""
    control = authority.CONTROLS[name]
    require_role(request, *control.allowed)
    plan = authority.visible_plan(request, plan_id)
    if action(plan=plan, by=request.user):
        messages.success(request, control.done)
    else:
        messages.error(request, control.refusal(plan))
    return redirect(services.plan_url(plan))


@require_POST
def cancel(request, plan_id):
    return _plan_action(request, plan_id, "cancel", services.cancel_plan)


@require_POST
def abort(request, plan_id):
    """Stop an approved, executing or paused plan: the item in flight finishes, nothing after it starts."""
    return _plan_action(request, plan_id, "abort", services.abort_plan)


@require_POST
def pause(request, plan_id):
    """Hold an executing plan after the item in flight; it goes on only when someone resumes it."""
    return _plan_action(request, plan_id, "pause", services.pause_plan)


@require_POST
def resume(request, plan_id):
    return _plan_action(request, plan_id, "resume", services.resume_plan)
