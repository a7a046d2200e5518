"""What is not a section of its own: the sign-in page, the landing page, the health check, the not-found page
and django-axes' lock-out page."""

import functools
import hmac
import ipaddress

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from journal.auth import roles
from journal.telemetry import metrics as telemetry_metrics

from .. import authority, observed
from .. import health as health_report


class SignIn(LoginView):
    """The sign-in page: the company's identity provider (OIDC_ISSUER) and, unless PASSWORD_LOGIN is off, a
    password; with passwords off, a password sent anyway is refused and nothing is checked."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "provider": settings.OIDC_PROVIDER_NAME
                if settings.OIDC_ISSUER else "", "passwords": settings.PASSWORD_LOGIN}

    def post(self, request, *args, **kwargs):
        if not settings.PASSWORD_LOGIN:
            context = self.get_context_data(form=self.get_form_class()(request))
            return self.render_to_response({**context, "passwords_off": True}, status=400)
        return super().post(request, *args, **kwargs)


@require_GET
@login_required
def home(request):
    """Where signing in lands: for an approver with plans waiting for their signature, those plans; else the
runs, for whoever may read them; the person an agent acts for, who may
    not, lands on their agents (and their runs) instead of a refusal."""
    reader = roles.has_any_role(request.user, roles.ON_CALL, roles.APPROVER, roles.ADMIN)
    if authority.waiting_for(request.user, limit=1)[0]:  # an approver lands on what waits for them
        return redirect(reverse("approver:plan_list") + "?waiting=me")
    return redirect("journal:run_list" if reader else "journal:agent_list")


def not_found(request, exception):
    """The 404 page (handler404): what a view said was not found ("No such agent among those you may
    see."), never a URL resolver's internals."""
    message = exception.args[0] if exception is not None and exception.args else ""
    return render(request, "404.html", {"message": message if isinstance(message, str) else ""}, status=404)


def locked_out(request, response, credentials):
    """django-axes' answer to a login while the account or the address is locked out
    (AXES_LOCKOUT_CALLABLE)."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    return render(request, "registration/locked_out.html", {
        "failure_limit": settings.AXES_FAILURE_LIMIT, "username": username[:150],
        "account_limit": settings.LOGIN_ACCOUNT_FAILURE_LIMIT,
        "address_limit": settings.LOGIN_ADDRESS_FAILURE_LIMIT,
        "minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)}, status=429)


@require_GET
@never_cache
def health(request):
    """Public, for load balancers and monitors; it names states, never hosts, versions or errors."""
    body = health_report.report()
    return JsonResponse(body, status=200 if body["status"] == "ok" else 503)


@require_GET
@never_cache
def metrics(request):
    """Prometheus's scrape: every process's counts and the database's states (`approver.observed`). Open to
    a scraper from an address in METRICS_ALLOW, or one that sends METRICS_TOKEN as a bearer token; 404 with
    METRICS=off."""
    if not settings.METRICS:
        raise Http404("Metrics are off here (METRICS=off).")
    if not scraper_allowed(request):
        response = HttpResponse("Metrics are open to the addresses in METRICS_ALLOW, or to a scraper that "
                                "sends METRICS_TOKEN as a bearer token.\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = telemetry_metrics.registry_now()
    registry.register(observed.States())
    return HttpResponse(telemetry_metrics.exposition(registry), content_type=CONTENT_TYPE_LATEST)


def scraper_allowed(request) -> bool:
    """A bearer METRICS_TOKEN, or an address in METRICS_ALLOW (the address uvicorn gives Django)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if settings.METRICS_TOKEN and scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), settings.METRICS_TOKEN.encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in _allowed_networks())


@functools.cache
def _allowed_networks() -> tuple:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in settings.METRICS_ALLOW)
