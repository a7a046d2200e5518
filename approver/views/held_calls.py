"""Calls an autonomy policy held for a person: the list, one call's page, and the signature on it."""

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from journal.auth import roles
from journal.auth.access import READERS, require_role
from journal.upstream import snapshots

from .. import authority, services, signing
from ..models import ActionRequest
from .sign_off import challenge, signing_step

ACTIONS_PER_PAGE = 25


@require_GET
def action_list(request):
    require_role(request, *READERS)
    actions = authority.visible_actions(request.user, ActionRequest.objects.select_related(
        "agent__on_behalf_of", "server", "step", "used_step")).order_by("-created_at", "-id")
    page = Paginator(actions, ACTIONS_PER_PAGE).get_page(request.GET.get("page"))
    now = timezone.now()
    for action in page:
        action.standing = services.standing_words(action, now=now)
    return render(request, "approver/action_list.html", {"page": page, "now": now})


@require_GET
def action_detail(request, action_id):
    require_role(request, *READERS)
    action = authority.visible_action(request, action_id, ActionRequest.objects.select_related(
        "agent__on_behalf_of", "server", "run", "step", "used_step"))
    keep = snapshots.keepable_of(((action.step.earlier_state if action.step else None) or {}).get("database")
                                 or {})
    return render(request, "approver/action_detail.html", {
        "action": action, "now": timezone.now(), "standing": services.standing_words(action),
        "kept_first": ", ".join(k["table"] for k in keep or ()),
        "approvals": action.approvals.select_related("approver", "passkey").order_by("created_at"),
        **authority.signing_state(request.user, role=action.approver_group,
                                  refusal=lambda: authority.action_refusal(action=action, user=request.user)),
    })


@require_POST
def action_sign_begin(request, action_id):
    """A one-time challenge for approving or denying the held call exactly as it stands. Any role may reach
    it; whether this person may decide is the held call's own rule (its policy's group, separation of
    duties)."""
    require_role(request, *roles.ALL)
    action = authority.visible_action(request, action_id, ActionRequest.objects.select_related("agent"))
    return signing_step(request, "decision", lambda body: challenge(*services.begin_action_signing(
        action=action, user=request.user, decision=str(body.get("decision", "")),
        reason=str(body.get("reason") or ""))))


@require_POST
def action_sign_complete(request, action_id):
    require_role(request, *roles.ALL)
    action = authority.visible_action(request, action_id)

    def complete(body):
        approval = services.complete_action_signing(user=request.user, nonce=str(body.get("nonce", "")),
                                                    credential=body.get("credential"), action=action)
        decided = approval.request
        decided.refresh_from_db()
        if approval.decision == signing.REJECT:
            messages.success(request, "You denied the call. The agent is told, with your reason.")
        elif decided.state == ActionRequest.State.APPROVED:
            messages.success(request, "You approved the call. It goes through once, exactly as shown.")
        else:
            messages.success(
                request, "You approved the call. It needs more approvals before it may go through."
            )
        return JsonResponse(
            {"ok": True, "redirect": reverse("approver:action_detail", args=[decided.public_id])}
        )

    return signing_step(request, "signature", complete)
