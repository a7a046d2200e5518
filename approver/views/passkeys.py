"""An approver's passkeys: the list, enrolling one (the service mints the challenge), revoking one. Enrolling
from a plan's page (`?next=`) comes back to it."""

import re

from django.contrib import messages
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from journal.auth import roles
from journal.auth.access import require_role

from .. import passkeys, services
from ..models import Passkey
from .sign_off import json_body

_REGISTRATION = "passkey-registration"  # session key: the one challenge in flight, and when it lapses


def _back_to(value) -> str:
    """Where to go back to once enrolled: a plan's or a held call's page on this site, else ""."""
    value = str(value or "")[:200]
    if not re.fullmatch(r"/(plans|actions)/[0-9a-f-]{36}/", value):
        return ""
    return value if url_has_allowed_host_and_scheme(value, allowed_hosts=None) else ""


@require_GET
def passkey_list(request):
    require_role(request, roles.APPROVER)
    keys = Passkey.objects.filter(user=request.user).order_by("revoked_at", "-created_at")
    return render(request, "approver/passkeys.html",
                  {"passkeys": keys, "back": _back_to(request.GET.get("next"))})


@require_POST
def passkey_options(request):
    """The options for `navigator.credentials.create()`, with a fresh one-time challenge (the service mints
    it;
    the session keeps it until the browser answers)."""
    require_role(request, roles.APPROVER)
    pending, options = services.begin_enrolment(user=request.user)
    request.session[_REGISTRATION] = pending
    return HttpResponse(options, content_type="application/json")


@require_POST
def passkey_enroll(request):
    """The browser's answer, as JSON `{"name", "credential"}`; the challenge it answers is used up."""
    require_role(request, roles.APPROVER)
    try:
        challenge = services.enrolment_challenge(pending=request.session.pop(_REGISTRATION, None))
    except passkeys.PasskeyRefused as refused:
        return JsonResponse({"error": refused.message}, status=400)
    body = json_body(request)
    if body is None:
        return JsonResponse({"error": "The browser's answer is not JSON."}, status=400)
    try:
        passkey = services.enroll_passkey(user=request.user, name=str(body.get("name") or ""),
                                          credential=body.get("credential"), challenge=challenge)
    except passkeys.PasskeyRefused as refused:
        return JsonResponse({"error": refused.message}, status=400)
    back = _back_to(body.get("next"))
    messages.success(request, f"Passkey “{passkey.name}” enrolled. " + (
        "You are back where you were, and can sign now." if back else "You can approve plans with it."))
    return JsonResponse({"ok": True, "redirect": back or reverse("approver:passkey_list")})


@require_POST
def passkey_revoke(request, passkey_id):
    require_role(request, roles.APPROVER)
    passkey = get_object_or_404(Passkey, pk=passkey_id, user=request.user)
    if services.revoke_passkey(passkey=passkey):
        messages.success(request, f"Passkey “{passkey.name}” revoked. It signs nothing more.")
    return redirect(reverse("approver:passkey_list"))
