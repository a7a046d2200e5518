from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from . import health as health_report


@require_GET
@never_cache
def health(request):
    """Public, for load balancers and monitors; it names states, never hosts, versions or errors."""
    body = health_report.report()
    return JsonResponse(body, status=200 if body["status"] == "ok" else 503)
