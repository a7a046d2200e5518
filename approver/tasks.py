"""Celery entry points of the approval side. Plans, checks and execution arrive with later issues; the
ping task lets the health page and the demo prove that a worker really runs tasks."""

from celery import shared_task


@shared_task(name="approver.ping")
def ping() -> str:
    return "pong"
