"""Webhooks a company can trust: endpoints admins register, and every delivery to them, kept with its status
(`approver.services.webhooks` makes and sends them)."""

import uuid

from django.db import models
from django.utils import timezone

EVENTS = {
    "plan.ready": "A plan is checked and ready for sign-off",
    "plan.approved": "A plan has its approvals and may run",
    "plan.rejected": "An approver rejected a plan",
    "plan.finished": "A plan finished running (its report)",
    "plan.override": "An approver asked to overwrite a newer change",
    "held_call.waiting": "An agent's call waits for a human",
    "lease.broken": "An admin broke a plan's lease on a record",
}


class WebhookEndpoint(models.Model):
    url = models.URLField(max_length=500, help_text="Where the events are POSTed (https in production).")
    description = models.CharField(max_length=200, blank=True)
    # Signs every delivery (HMAC-SHA256); kept as it is, since signing needs it. Shown to admins to copy.
    secret = models.CharField(max_length=100, editable=False)
    events = models.JSONField(default=list, blank=True, help_text="The events it hears; empty: every one.")
    team = models.ForeignKey("journal.Team", on_delete=models.CASCADE, null=True, blank=True,
                             related_name="+", help_text="Only this team's events; blank: every team's.")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.description or self.url

    def hears(self, event: str, team_id: int | None) -> bool:
        return (self.is_active and (not self.events or event in self.events)
                and (self.team_id is None or self.team_id == team_id))


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Waiting to be sent"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Gave up"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False,
                                 help_text="The same on every attempt: receivers drop a repeat by it.")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40)
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self):
        return f"{self.event} to {self.endpoint} ({self.state})"
