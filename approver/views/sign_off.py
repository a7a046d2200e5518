"""A passkey signature, begun and completed as two JSON steps: on a plan here, on a held call in
`held_calls`, which shares the steps' shape (`signing_step`, `challenge`)."""

import json

from django.contrib import messages
from django.http import JsonResponse
from django.views.decorators.http import require_POST

from journal.auth import roles
from journal.auth.access import require_role

from .. import authority, services, signing
from ..models import Plan


def json_body(request) -> dict | None:
    try:
        body = json.loads(request.body)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def signing_step(request, what: str, step):
    """One step of a passkey signature (begin or complete): a JSON body in, `step(body)`'s JSON out, and a
    refusal as a 400 with its reason, which the page shows."""
    body = json_body(request)
    if body is None:
        return JsonResponse({"error": f"Send the {what} as JSON."}, status=400)
    try:
        return step(body)
    except signing.SigningRefused as refused:
        return JsonResponse({"error": refused.message}, status=400)


def challenge(signing_request, options: str) -> JsonResponse:
    return JsonResponse({"nonce": signing_request.nonce, "publicKey": json.loads(options)})


@require_POST
def sign_begin(request, plan_id):
    """A one-time challenge for approving or rejecting the plan as it is now, with the signer's choices."""
    require_role(request, roles.APPROVER)
    plan = authority.visible_plan(request, plan_id)
    return signing_step(request, "decision", lambda body: challenge(*services.begin_signing(
        plan=plan, user=request.user, decision=str(body.get("decision", "")), choices=body.get("choices"),
        overrides=body.get("overrides"), reason=str(body.get("reason") or ""))))


@require_POST
def sign_complete(request, plan_id):
    require_role(request, roles.APPROVER)
    plan = authority.visible_plan(request, plan_id)

    def complete(body):
        approval = services.complete_signing(user=request.user, nonce=str(body.get("nonce", "")),
                                             credential=body.get("credential"), plan=plan)
        plan.refresh_from_db()
        if approval.decision == signing.REJECT:
            messages.success(request, "You rejected the plan. Nothing will be undone.")
        elif plan.state == Plan.State.APPROVED:
            messages.success(request, "You approved the plan. The quorum is reached: it may now run.")
        else:
            messages.success(request, "You approved the plan. It needs more approvals before it may run.")
        return JsonResponse({"ok": True, "redirect": services.plan_url(plan)})

    return signing_step(request, "signature", complete)
