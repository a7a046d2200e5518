import json
import secrets
import time

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRefresh
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url

from journal import roles
from journal.access import READERS, require_role
from journal.models import Run

from . import authority, execution, passkeys, policy, services, signing
from . import health as health_report
from .forms import PolicyForm, UndoRequestForm
from .models import ActionRequest, ApprovalRules, AutonomyPolicy, Passkey, Plan, PlanItem, PolicyChange


def locked_out(request, response, credentials):
    """django-axes' answer to a login while the account or the address is locked out (AXES_LOCKOUT_CALLABLE)."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    return render(request, "registration/locked_out.html", {
        "failure_limit": settings.AXES_FAILURE_LIMIT, "username": username[:150],
        "minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)}, status=429)


@require_GET
@never_cache
def health(request):
    """Public, for load balancers and monitors; it names states, never hosts, versions or errors."""
    body = health_report.report()
    return JsonResponse(body, status=200 if body["status"] == "ok" else 503)


# -- reversal plans ---------------------------------------------------------------------------------------

PLANS_PER_PAGE = 25


@require_POST
def request_undo(request, run_id):
    """On-call asks to undo a run from step N, or the steps they ticked: the plan is opened at once, and the
    worker drafts it and checks it while the plan page shows how far it got."""
    require_role(request, roles.ON_CALL)
    run = get_object_or_404(Run, public_id=run_id)
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
    messages.success(request, f"Plan asked for: undo {plan.selection_text}. The worker drafts it, then checks every "
                              "step with the tool servers.")
    return redirect(services.plan_url(plan))


@require_GET
def plan_list(request):
    require_role(request, *READERS)
    plans = Plan.objects.for_page().order_by("-created_at", "-id")
    page = Paginator(plans, PLANS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "approver/plan_list.html", {"page": page})


@require_GET
def plan_detail(request, plan_id):
    require_role(request, *READERS)
    plan = get_object_or_404(Plan.objects.for_page(), public_id=plan_id)
    if request.htmx and request.GET.get("was") == Plan.State.DRAFTING and plan.state != Plan.State.DRAFTING:
        return HttpResponseClientRefresh()  # drafted: the whole page changes (its heading too), not the fragment
    template = "approver/plan_detail.html#checks" if request.htmx else "approver/plan_detail.html"
    return render(request, template, _plan_context(request, plan))


def _plan_context(request, plan: Plan) -> dict:
    items = list(services.items_for_page(plan))
    by_action = {action: [i for i in items if i.action == action] for action in PlanItem.Action.values}
    return {
        "plan": plan,
        "undo": by_action[PlanItem.Action.COMPENSATE],
        "cannot": by_action[PlanItem.Action.CANNOT_UNDO],
        "nothing": by_action[PlanItem.Action.NOTHING_TO_UNDO],
        "already": by_action[PlanItem.Action.ALREADY_UNDONE],
        "changed": [i for i in items if i.check_status == PlanItem.Check.CONFLICT],
        "now": timezone.now(),
        **authority.plan_buttons(request.user, plan),
        "report": _report(plan, items),
        **_sign_off_context(request, plan),
    }


def _report(plan: Plan, items: list) -> dict | None:
    if plan.state not in (Plan.State.EXECUTING, Plan.State.PAUSED, *Plan.FINISHED_STATES):
        return None
    return {"done": sum(i.exec_state == PlanItem.Exec.DONE for i in items), "total": len(items),
            "to_do": [i for i in items if i.outcome in execution.NEEDS_A_HUMAN]}


def _sign_off_context(request, plan: Plan) -> dict:
    """Who signed what, what counts, and whether this user may sign now (and if not, why)."""
    rules = ApprovalRules.current()
    approvals = list(plan.approvals.select_related("approver", "passkey").order_by("created_at"))
    counting = {a.pk for a in authority.counting_approvals(plan=plan, rules=rules)}
    current = services.plan_content(plan) if any(a.digest != plan.digest for a in approvals) else None
    signed = [{"approval": a, "counts": a.pk in counting,
               "changes": signing.content_changes(a.content, current) if current and a.digest != plan.digest else []}
              for a in approvals]
    refusal = ""
    if plan.state == Plan.State.READY and roles.has_role(request.user, roles.APPROVER):
        refusal = authority.signing_refusal(plan=plan, user=request.user, rules=rules) or (
            "" if Passkey.objects.active().filter(user=request.user).exists() else "no-passkey")
    return {"rules": rules, "signed": signed, "counting": len(counting),
            "may_sign": plan.state == Plan.State.READY and roles.has_role(request.user, roles.APPROVER) and not refusal,
            "sign_refusal": refusal}


@require_POST
def check_again(request, plan_id):
    require_role(request, *authority.MAY_CHECK)
    plan = get_object_or_404(Plan, public_id=plan_id)
    if services.queue_checks(plan=plan):
        messages.success(request, "Checking again with the tool servers.")
    else:
        messages.error(request, f"This plan is {plan.get_state_display().lower()}; it cannot be checked now.")
    return redirect(services.plan_url(plan))


def _plan_action(request, plan_id, action, done: str, refused: str):
    """A state change on one plan by the signed-in user; the service says whether the plan allowed it."""
    plan = get_object_or_404(Plan, public_id=plan_id)
    if action(plan=plan, by=request.user):
        messages.success(request, done)
    else:
        messages.error(request, f"This plan is {plan.get_state_display().lower()}; {refused}")
    return redirect(services.plan_url(plan))


@require_POST
def cancel(request, plan_id):
    require_role(request, *authority.MAY_CANCEL)
    return _plan_action(request, plan_id, services.cancel_plan, "Plan cancelled. Its steps can go into a new plan.",
                        "it can no longer be cancelled.")


# -- passkeys -----------------------------------------------------------------------------------------------

_REGISTRATION = "passkey-registration"  # session key: the one challenge in flight, and when it lapses


@require_GET
def passkey_list(request):
    require_role(request, roles.APPROVER)
    keys = Passkey.objects.filter(user=request.user).order_by("revoked_at", "-created_at")
    return render(request, "approver/passkeys.html", {"passkeys": keys})


@require_POST
def passkey_options(request):
    """The options for `navigator.credentials.create()`, with a fresh one-time challenge."""
    require_role(request, roles.APPROVER)
    challenge = secrets.token_bytes(32)
    request.session[_REGISTRATION] = {"challenge": bytes_to_base64url(challenge),
                                      "expires": time.time() + passkeys.CHALLENGE_SECONDS}
    return HttpResponse(services.passkey_registration_options(user=request.user, challenge=challenge),
                        content_type="application/json")


@require_POST
def passkey_enroll(request):
    """The browser's answer, as JSON `{"name", "credential"}`; the challenge it answers is used up."""
    require_role(request, roles.APPROVER)
    pending = request.session.pop(_REGISTRATION, None)
    if not pending or pending.get("expires", 0) < time.time():
        return JsonResponse({"error": "The enrolment took too long or was already used; start again."}, status=400)
    body = _json_body(request)
    if body is None:
        return JsonResponse({"error": "The browser's answer is not JSON."}, status=400)
    try:
        passkey = services.enroll_passkey(user=request.user, name=str(body.get("name") or ""),
                                          credential=body.get("credential"),
                                          challenge=base64url_to_bytes(pending["challenge"]))
    except passkeys.PasskeyRefused as refused:
        return JsonResponse({"error": refused.message}, status=400)
    messages.success(request, f"Passkey “{passkey.name}” enrolled. You can approve plans with it.")
    return JsonResponse({"ok": True, "redirect": reverse("approver:passkey_list")})


@require_POST
def passkey_revoke(request, passkey_id):
    require_role(request, roles.APPROVER)
    passkey = get_object_or_404(Passkey, pk=passkey_id, user=request.user)
    if services.revoke_passkey(passkey=passkey):
        messages.success(request, f"Passkey “{passkey.name}” revoked. It signs nothing more.")
    return redirect(reverse("approver:passkey_list"))


# -- sign-off -----------------------------------------------------------------------------------------------


def _json_body(request) -> dict | None:
    try:
        body = json.loads(request.body)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _signing_step(request, what: str, step):
    """One step of a passkey signature (begin or complete): a JSON body in, `step(body)`'s JSON out, and a
    refusal as a 400 with its reason, which the page shows."""
    body = _json_body(request)
    if body is None:
        return JsonResponse({"error": f"Send the {what} as JSON."}, status=400)
    try:
        return step(body)
    except signing.SigningRefused as refused:
        return JsonResponse({"error": refused.message}, status=400)


def _challenge(signing_request, options: str) -> JsonResponse:
    return JsonResponse({"nonce": signing_request.nonce, "publicKey": json.loads(options)})


@require_POST
def sign_begin(request, plan_id):
    """A one-time challenge for approving or rejecting the plan as it is now, with the signer's choices."""
    require_role(request, roles.APPROVER)
    plan = get_object_or_404(Plan, public_id=plan_id)
    return _signing_step(request, "decision", lambda body: _challenge(*services.begin_signing(
        plan=plan, user=request.user, decision=str(body.get("decision", "")), choices=body.get("choices"),
        reason=str(body.get("reason") or ""))))


@require_POST
def sign_complete(request, plan_id):
    require_role(request, roles.APPROVER)
    plan = get_object_or_404(Plan, public_id=plan_id)

    def complete(body):
        approval = services.complete_signing(user=request.user, nonce=str(body.get("nonce", "")),
                                             credential=body.get("credential"))
        plan.refresh_from_db()
        if approval.decision == signing.REJECT:
            messages.success(request, "You rejected the plan. Nothing will be undone.")
        elif plan.state == Plan.State.APPROVED:
            messages.success(request, "You approved the plan. The quorum is reached: it may now run.")
        else:
            messages.success(request, "You approved the plan. It needs more approvals before it may run.")
        return JsonResponse({"ok": True, "redirect": services.plan_url(plan)})

    return _signing_step(request, "signature", complete)



@require_POST
def abort(request, plan_id):
    """Stop an approved, executing or paused plan: the item in flight finishes, nothing after it starts."""
    require_role(request, *authority.MAY_CONTROL)
    return _plan_action(request, plan_id, services.abort_plan, "Aborted: nothing that has not started will run.",
                        "there is nothing to abort.")


@require_POST
def pause(request, plan_id):
    """Hold an executing plan after the item in flight; it goes on only when someone resumes it."""
    require_role(request, *authority.MAY_CONTROL)
    return _plan_action(request, plan_id, services.pause_plan,
                        "Paused: the item in flight finishes, nothing else starts until you resume.",
                        "it cannot be paused.")


@require_POST
def resume(request, plan_id):
    require_role(request, *authority.MAY_CONTROL)
    return _plan_action(request, plan_id, services.resume_plan,
                        "Resumed: the approvals are checked again before each item.", "there is nothing to resume.")


# -- outcomes nobody knows: a human looks, then settles or tries again ----------------------------------------


def _settling(request, plan_id, position: int, action, done: str):
    plan = get_object_or_404(Plan, public_id=plan_id)
    try:
        answer = action(plan=plan, position=position, by=request.user)
    except services.NotSettled as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, done.format(answer=answer.get("message", "") if isinstance(answer, dict) else ""))
    return redirect(f"{services.plan_url(plan)}#item-{position}")


@require_POST
def check_outcome(request, plan_id, position):
    """Ask the tool server, changing nothing, where a compensation whose outcome is unknown stands."""
    require_role(request, *authority.MAY_SETTLE)
    return _settling(request, plan_id, position, services.check_unknown, "The server's answer: {answer}")


@require_POST
def settle_outcome(request, plan_id, position):
    """A human's word, after looking: the compensation took effect, or it did not."""
    require_role(request, *authority.MAY_SETTLE)
    settlement = request.POST.get("settlement", "")

    def settle(**kwargs):
        return services.settle_unknown(settlement=settlement, **kwargs)

    return _settling(request, plan_id, position, settle, "Recorded. The report is counted again.")


@require_POST
def retry_outcome(request, plan_id, position):
    """Run the compensation again with the same idempotency key: an approver's decision, after looking."""
    require_role(request, *authority.MAY_CONTROL)
    return _settling(request, plan_id, position, services.retry_unknown,
                     "Trying again with the same idempotency key; the approvals were checked first.")


# -- held calls ---------------------------------------------------------------------------------------------------

ACTIONS_PER_PAGE = 25


@require_GET
def action_list(request):
    require_role(request, *READERS)
    actions = ActionRequest.objects.select_related("agent__on_behalf_of", "server").order_by("-created_at", "-id")
    page = Paginator(actions, ACTIONS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "approver/action_list.html", {"page": page, "now": timezone.now()})


@require_GET
def action_detail(request, action_id):
    require_role(request, *READERS)
    action = get_object_or_404(ActionRequest.objects.select_related("agent__on_behalf_of", "server", "run", "step",
                                                                     "used_step"), public_id=action_id)
    refusal = authority.action_refusal(action=action, user=request.user) if roles.has_role(
        request.user, action.approver_group) else ""
    has_key = Passkey.objects.active().filter(user=request.user).exists()
    return render(request, "approver/action_detail.html", {
        "action": action, "now": timezone.now(),
        "approvals": action.approvals.select_related("approver", "passkey").order_by("created_at"),
        "may_sign": action.state == ActionRequest.State.PENDING and roles.has_role(request.user, action.approver_group)
        and not refusal and has_key,
        "sign_refusal": refusal or ("no-passkey" if roles.has_role(request.user, action.approver_group)
                                    and action.state == ActionRequest.State.PENDING and not has_key else ""),
    })


@require_POST
def action_sign_begin(request, action_id):
    """A one-time challenge for approving or denying the held call exactly as it stands. Any role may reach
    it; whether this person may decide is the held call's own rule (its policy's group, separation of duties)."""
    require_role(request, *roles.ALL)
    action = get_object_or_404(ActionRequest.objects.select_related("agent"), public_id=action_id)
    return _signing_step(request, "decision", lambda body: _challenge(*services.begin_action_signing(
        action=action, user=request.user, decision=str(body.get("decision", "")),
        reason=str(body.get("reason") or ""))))


@require_POST
def action_sign_complete(request, action_id):
    require_role(request, *roles.ALL)

    def complete(body):
        approval = services.complete_action_signing(user=request.user, nonce=str(body.get("nonce", "")),
                                                    credential=body.get("credential"))
        action = approval.request
        action.refresh_from_db()
        if approval.decision == signing.REJECT:
            messages.success(request, "You denied the call. The agent is told, with your reason.")
        elif action.state == ActionRequest.State.APPROVED:
            messages.success(request, "You approved the call. It goes through once, exactly as shown.")
        else:
            messages.success(request, "You approved the call. It needs more approvals before it may go through.")
        return JsonResponse({"ok": True, "redirect": reverse("approver:action_detail", args=[action.public_id])})

    get_object_or_404(ActionRequest, public_id=action_id)
    return _signing_step(request, "signature", complete)


# -- autonomy policies (admins only) -----------------------------------------------------------------------------


@require_GET
def policy_list(request):
    require_role(request, roles.ADMIN)
    rows = services.current_policies()
    return render(request, "approver/policy_list.html", {
        "policies": [(row, services.as_policy(row)) for row in sorted(
            rows, key=lambda r: policy.SCOPES.index(r.scope))],
        "classes": [(klass, policy.CLASS_SHORT[klass], policy.CLASS_WORDS[klass]) for klass in policy.CLASSES],
        "changes": PolicyChange.objects.order_by("-seq")[:POLICY_CHANGES_SHOWN],
        "verdict": services.verify_policy_log(),
    })


POLICY_CHANGES_SHOWN = 30


@require_http_methods(["GET", "POST"])
def policy_edit(request, policy_id=None):
    """Create or change a policy. "Simulate" (htmx, or a plain POST without JavaScript) shows what the draft
    would have decided for recent calls; "Save" records the change and it applies to the next call."""
    require_role(request, roles.ADMIN)
    row = get_object_or_404(AutonomyPolicy.objects.select_related("agent", "server"), pk=policy_id) \
        if policy_id else AutonomyPolicy(decisions=dict(policy.DEFAULT_DECISIONS))
    form = PolicyForm(request.POST or None, instance=row)
    simulation = None
    if request.method == "POST" and form.is_valid():
        draft = form.save(commit=False)
        try:
            if "save" in request.POST:
                services.save_policy(row=draft, by=request.user)
                messages.success(request, f"Policy “{draft.name}” saved. It applies from the next call.")
                return redirect("approver:policy_list")
            services.clean_policy(draft)
            simulation = services.simulate_policy(draft=draft, last=form.cleaned_data.get("last") or 200)
        except services.PolicyRefused as refused:
            for field, problem in refused.problems.items():
                form.add_error(field if field in form.fields else None, problem)
    template = "approver/policy_edit.html#simulation" if request.htmx else "approver/policy_edit.html"
    return render(request, template, {"form": form, "row": row, "simulation": simulation})


@require_POST
def policy_delete(request, policy_id):
    require_role(request, roles.ADMIN)
    row = get_object_or_404(AutonomyPolicy.objects.select_related("agent", "server"), pk=policy_id)
    services.delete_policy(row=row, by=request.user)
    messages.success(request, f"Policy “{row.name}” deleted. The next call is decided without it.")
    return redirect("approver:policy_list")
