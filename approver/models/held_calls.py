"""Calls the Recorder holds for a human (an autonomy policy's "ask"), and the signed decisions on them."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from journal.models import Run, Step
from journal.ports import HeldState

from ..policy import CLASS_WORDS
from .approvals import Passkey
from .policies import AutonomyPolicy


class ActionRequest(models.Model):
    """A call the Recorder holds because its policy says `ask`: the exact call (server, tool, arguments,
    _meta)
    approvers sign with a passkey (`digest`), and whether its one call through has been used."""

    class State(models.TextChoices):
        PENDING = HeldState.PENDING, "Waiting for approval"
        APPROVED = HeldState.APPROVED, "Approved"
        DENIED = HeldState.DENIED, "Denied"
        EXPIRED = HeldState.EXPIRED, "Expired"
        USED = HeldState.USED, "Approved and made"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    agent = models.ForeignKey("journal.Agent", on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    step = models.ForeignKey(Step, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
                             help_text="The first call that was held for it.")
    server = models.ForeignKey("journal.ToolServer", on_delete=models.PROTECT, related_name="+")
    tool = models.CharField(max_length=200)
    arguments = models.JSONField()
    meta = models.JSONField(
        null=True, blank=True, help_text="The _meta sent, as approved (plus the Recorder's key)."
    )
    digest = models.CharField(
        max_length=64, help_text="SHA-256 of the JCS of {agent, server, tool, arguments, meta}."
    )
    call_class = models.CharField(max_length=30)
    reason = models.TextField(help_text="The policy's decision, in words.")
    why = models.JSONField(default=dict, blank=True, help_text="The server's own reason and remedy.")
    policy = models.ForeignKey(
        AutonomyPolicy, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    policy_name = models.CharField(max_length=100, blank=True)
    approver_group = models.CharField(max_length=150)
    quorum = models.PositiveSmallIntegerField(default=1)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(help_text="After this, an approval can no longer be given or used.")
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=300, blank=True)
    decision_reason = models.TextField(blank=True)
    used_at = models.DateTimeField(null=True, blank=True)
    used_step = models.ForeignKey(Step, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    notified = models.BooleanField(default=False)
    notified_at = models.DateTimeField(null=True, blank=True, help_text="When its approvers were told.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["digest", "state"])]

    def __str__(self):
        return f"held call {self.server_id}:{self.tool} ({self.state})"

    @property
    def class_words(self) -> str:
        return CLASS_WORDS.get(self.call_class, self.call_class)


class ActionApproval(models.Model):
    """A signed decision on a held call, verifiable offline like a plan's approval."""

    class Decision(models.TextChoices):
        APPROVE = "approve", "Approved"
        REJECT = "reject", "Denied"

    request = models.ForeignKey(ActionRequest, on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    passkey = models.ForeignKey(Passkey, on_delete=models.PROTECT, related_name="action_approvals")
    decision = models.CharField(max_length=10, choices=Decision.choices)
    reason = models.TextField(blank=True)
    digest = models.CharField(max_length=64)
    nonce = models.CharField(max_length=64, unique=True)
    challenge = models.CharField(max_length=64)
    assertion = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["request", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["request", "approver"], name="one_decision_per_approver")
        ]

    def __str__(self):
        return f"{self.get_decision_display()} by {self.approver} on {self.request}"
