"""What the health page and `manage.py health` report: the database, the broker, and the workers."""

import logging

from django.db import connection

from .celery import app as celery_app

logger = logging.getLogger(__name__)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:  # the health report reports; it does not fail
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


def report() -> dict:
    """States only: no versions, hosts or error text (those go to the log)."""
    database, broker = _database(), _broker()
    workers, count = _workers() if broker == "ok" else ("unknown", 0)
    ok = database == broker == workers == "ok"
    return {"status": "ok" if ok else "degraded", "database": database, "broker": broker, "worker": workers,
            "workers": count}
