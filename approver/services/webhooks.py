"""Webhooks a company can trust: each event is kept as one delivery per endpoint that hears it (in the
transaction that made the event, so none is lost), sent by the worker signed as Stripe and GitHub sign
theirs, and sent again with backoff until the endpoint answers 2xx or the attempts run out.

What a delivery carries:

- the body, JSON: `{"id", "type", "createdAt", "data"}`, `id` the delivery's, the same on every attempt;
- `Undo-Webhook-Id` (that id), `Undo-Webhook-Event` (the type), and `Undo-Webhook-Signature`:
  `t=UNIX_SECONDS,v1=HEX`, HEX the HMAC-SHA256, keyed with the endpoint's secret, of `f"{t}.{body}"`. A
  receiver recomputes it, refuses a `t` more than five minutes old, and drops an id it has seen.
"""

import json
import secrets
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from journal.audit.sinks import signature  # the one HMAC both signed streams use

from ..models import WebhookDelivery, WebhookEndpoint
from . import bell

SIGNATURE_HEADER = "Undo-Webhook-Signature"
ID_HEADER = "Undo-Webhook-Id"
EVENT_HEADER = "Undo-Webhook-Event"
TIMEOUT_SECONDS = 10


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def emit(event: str, data: dict[str, Any], *, team_id: int | None, now: datetime | None = None) -> int:
    """Keep `event` for every active endpoint that hears it (its events, its team), and ring the worker to
    send each once this transaction commits. Returns how many deliveries were made."""
    now = now or timezone.now()
    made = 0
    with transaction.atomic():
        for endpoint in WebhookEndpoint.objects.filter(is_active=True).order_by("pk"):
            if not endpoint.hears(event, team_id):
                continue
            public_id = uuid.uuid4()
            delivery = WebhookDelivery.objects.create(
                public_id=public_id, endpoint=endpoint, event=event, next_attempt_at=now, created_at=now,
                payload={"id": str(public_id), "type": event, "createdAt": now.isoformat(), "data": data})
            bell.ring(bell.DELIVER_WEBHOOK, delivery.pk)
            made += 1
    return made


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: 10 s, 30 s, 90 s, … up to an hour."""
    return min(10.0 * 3 ** (attempts - 1), 3600.0)


def deliver(delivery_id: int, *, now: datetime | None = None) -> str:
    """Send one delivery if it is due: claimed first (its next attempt moved past this one's timeout, so a
    second worker or the sweep does not send it at the same time), then POSTed, then kept as it went."""
    now = now or timezone.now()
    with transaction.atomic():
        delivery = (WebhookDelivery.objects.select_for_update(skip_locked=True).select_related("endpoint")
                    .filter(pk=delivery_id, state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now)
                    .first())
        if delivery is None:
            return "not due"
        delivery.attempts += 1
        delivery.next_attempt_at = now + timedelta(seconds=2 * TIMEOUT_SECONDS)
        delivery.save(update_fields=["attempts", "next_attempt_at"])
    body = json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False).encode()
    status, error = _post(delivery, body)
    done = status is not None and 200 <= status < 300
    given_up = not done and delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS
    later = timezone.now() + timedelta(seconds=backoff(delivery.attempts))
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        last_status=status, last_error=error,
        state=(WebhookDelivery.State.DELIVERED if done else
               WebhookDelivery.State.FAILED if given_up else WebhookDelivery.State.PENDING),
        delivered_at=timezone.now() if done else None,
        next_attempt_at=later if not (done or given_up) else delivery.next_attempt_at)
    if not (done or given_up):
        bell.ring(bell.DELIVER_WEBHOOK, delivery.pk, countdown=backoff(delivery.attempts))
    return "delivered" if done else "gave up" if given_up else "will try again"


def _post(delivery: WebhookDelivery, body: bytes) -> tuple[int | None, str]:
    timestamp = int(time.time())
    headers = {"Content-Type": "application/json", "User-Agent": "agent-undo-webhooks/1",
               ID_HEADER: str(delivery.public_id), EVENT_HEADER: delivery.event,
               SIGNATURE_HEADER: signature(delivery.endpoint.secret, timestamp, body)}
    try:
        response = httpx.post(delivery.endpoint.url, content=body, headers=headers, timeout=TIMEOUT_SECONDS,
                              follow_redirects=False)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:1000]
    return response.status_code, "" if response.is_success else response.text[:1000]


def sweep(*, now: datetime | None = None) -> int:
    """Ring again for deliveries that are due and nobody is sending (a lost ring, a worker killed
    mid-send)."""
    due = list(WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING,
                                              next_attempt_at__lte=now or timezone.now())
               .values_list("pk", flat=True)[:500])
    for delivery_id in due:
        bell.ring(bell.DELIVER_WEBHOOK, delivery_id)
    return len(due)


def send_again(*, delivery: WebhookDelivery) -> None:
    """An admin sends a delivery that gave up once more (same id: a receiver that had it drops it)."""
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            state=WebhookDelivery.State.PENDING, attempts=0, next_attempt_at=timezone.now())
        bell.ring(bell.DELIVER_WEBHOOK, delivery.pk)
