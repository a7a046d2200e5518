"""A person's API tokens: the list, making one (shown once, on the page that made it), revoking one."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from journal.auth import roles
from journal.auth.access import require_role

from .. import services
from ..models import PersonalToken

DAYS = (7, 30, 90)  # what the form offers (API_TOKEN_MAX_DAYS caps them)


@never_cache  # the page that shows a new token once is kept by no cache
@require_http_methods(["GET", "POST"])
def token_list(request):
    require_role(request, *roles.ALL)
    made, problem = None, ""
    if request.method == "POST":
        try:
            days = int(request.POST.get("days") or 0)
        except ValueError:
            days = 0
        try:
            made = services.make_token(user=request.user, name=request.POST.get("name", ""), days=days,
                                       scope=request.POST.get("scope", ""))
        except services.TokenRefused as refused:
            problem = refused.message
    return render(request, "approver/tokens.html", {
        "tokens": PersonalToken.objects.filter(user=request.user),
        "made": made[1] if made else "", "made_row": made[0] if made else None, "problem": problem,
        "days": [d for d in DAYS if d <= services.api_token_max_days()],
        "scopes": PersonalToken.Scope.choices,
        "posted": request.POST if problem else {},
    }, status=400 if problem else 200)


@require_POST
def token_revoke(request, token_id):
    require_role(request, *roles.ALL)
    token = get_object_or_404(PersonalToken, pk=token_id, user=request.user)
    if services.revoke_token(token=token):
        messages.success(request, f"Token “{token.name}” revoked. It opens nothing from now on.")
    return redirect(reverse("approver:token_list"))
