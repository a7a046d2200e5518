import logging

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .celery import app as celery_app

logger = logging.getLogger(__name__)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # the health page reports, it does not fail
        logger.warning("health: database: %s", exc)
        return "unavailable"


def _broker() -> str:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        logger.warning("health: broker: %s", exc)
        return "unavailable"


def _workers() -> tuple[str, int]:
    try:
        replies = celery_app.control.ping(timeout=1.0)
    except Exception as exc:
        logger.warning("health: workers: %s", exc)
        return "unavailable", 0
    return ("ok" if replies else "none running"), len(replies)


@require_GET
@never_cache
def health(request):
    """Public and terse: states only, no versions, hosts or error text (those go to the log)."""
    database, broker = _database(), _broker()
    workers, count = _workers() if broker == "ok" else ("unknown", 0)
    ok = database == broker == workers == "ok"
    return JsonResponse(
        {"status": "ok" if ok else "degraded", "database": database, "broker": broker, "worker": workers,
         "workers": count},
        status=200 if ok else 503,
    )
