"""Thin Celery entry points for the Recorder side."""

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from . import services
from .models import Run, ToolServer
from .services import clients
from .upstream.database import DatabaseUnreachable

logger = logging.getLogger(__name__)

QUIET_AFTER = timedelta(seconds=30)
# How long past the longest call a step is given before it counts as left by a Recorder that died.
GRACE_SECONDS = 60


@shared_task(name="journal.checkpoint_quiet_runs")
def checkpoint_quiet_runs() -> int:
    """Sign the head of every run that went quiet with unsigned entries. Safe to run twice: a run whose
    head is already signed is skipped inside `checkpoint_run`, under the run's lock."""
    quiet = timezone.now() - QUIET_AFTER
    signed = 0
    for run in Run.objects.filter(last_activity_at__lt=quiet, head_seq__gt=F("checkpointed_seq")).only("pk"):
        if services.checkpoint_run(run=run) is not None:
            signed += 1
    return signed


@shared_task(name="journal.reconcile_stale_steps")
def reconcile_stale_steps() -> int:
    """Mark calls whose outcome was never recorded (a Recorder that died mid-call). Safe to run twice."""
    horizon = timezone.now() - timedelta(seconds=settings.TOOL_SERVER_TIMEOUT + GRACE_SECONDS)
    return services.reconcile_stale_steps(older_than=horizon)


@shared_task(name="journal.forget_idle_sessions")
def forget_idle_sessions() -> int:
    """Delete the records of agent sessions unused for RECORDER_SESSION_IDLE_SECONDS (no process serves
    them any more: `journal.mcp.sessions`)."""
    return services.forget_idle_agent_sessions(idle_seconds=settings.RECORDER_SESSION_IDLE_SECONDS,
                                               now=timezone.now())


@shared_task(name="journal.forget_unused_oauth_clients")
def forget_unused_oauth_clients() -> int:
    """Remove OAuth clients that registered themselves a day ago or more and were never authorised, and the
    exchanged codes whose tokens could no longer be alive."""
    now = timezone.now()
    refresh_life = timedelta(seconds=settings.OAUTH2_PROVIDER["REFRESH_TOKEN_EXPIRE_SECONDS"])
    clients.forget_redeemed_codes(older_than=now - refresh_life)
    return clients.forget_unused_clients(older_than=now - timedelta(days=1))


@shared_task(name="journal.prune_captures")
def prune_captures() -> int:
    """Sweep each database capture for rows no recorded call made, then forget the rows no undo needs any
    more (`services.prune_capture`), server by server; a database that cannot be reached is tried again
    next time, and nothing of it is forgotten unswept."""
    forgotten = 0
    for server in ToolServer.objects.exclude(database=""):
        try:
            forgotten += services.prune_capture(server=server)
        except DatabaseUnreachable as exc:
            logger.warning("The capture of %s was not pruned: %s", server.name, exc)
    return forgotten
