"""Passkeys, the approval rules, and the signed approvals of plans."""

from datetime import timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from .plans import Plan


class PasskeyQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class Passkey(models.Model):
    """A WebAuthn credential an approver signs with. Revoked passkeys are kept: old approvals name them,
    and an offline check needs their public keys."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="passkeys")
    name = models.CharField(max_length=100)
    credential_id = models.CharField(max_length=1400, unique=True, help_text="base64url")
    public_key = models.TextField(help_text="COSE public key, base64url")
    sign_count = models.PositiveBigIntegerField(default=0)
    transports = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = PasskeyQuerySet.as_manager()

    class Meta:
        ordering = ["user", "created_at"]

    def __str__(self):
        return f"{self.name} ({self.user})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class ApprovalRules(models.Model):
    """Who may approve and how many must: a row for every team without its own (`team` blank) and one for
    each team that has its own, which admins edit. `ApprovalRules.current(team_id)` reads the team's, else
    the shared row, with these defaults if nobody has saved it yet."""

    team = models.OneToOneField("journal.Team", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="approval_rules",
                                help_text="Blank: the rules of every team that has none of its own.")

    approver_role = models.CharField(max_length=80, default="approver",
                                     help_text="The group whose members may approve or reject plans.")
    quorum = models.PositiveSmallIntegerField(default=2, validators=[MinValueValidator(1)],
                                              help_text="Distinct approvers needed before a plan may run.")
    valid_for = models.DurationField(
        default=timedelta(hours=24),
        help_text="How long an approval counts (never past the plan's first undo deadline).",
    )
    separation_of_duties = models.BooleanField(
        default=True,
        help_text="The person who asked for the plan and the person the agent acted for cannot approve it.",
    )

    class Meta:
        verbose_name = verbose_name_plural = "approval rules"

    def __str__(self):
        return (f"{self.quorum} approver(s) from {self.approver_role}, valid {self.valid_for}"
                + (f", for team {self.team}" if self.team_id else ""))

    @classmethod
    def current(cls, team_id: int | None = None) -> "ApprovalRules":
        """The rules team `team_id` works by: its own if it has them, else the shared ones."""
        rows = {rules.team_id: rules for rules in cls.objects.filter(
            models.Q(team__isnull=True) | models.Q(team_id=team_id)).order_by("-pk")}
        return rows.get(team_id) or rows.get(None) or cls()

    @classmethod
    def of_plan(cls, plan) -> "ApprovalRules":
        return cls.current(plan.run.team_id)


class SigningRequest(models.Model):
    """A one-time challenge handed to an approver's browser: what they are about to sign."""

    # What is being signed: a plan, or a call held by an autonomy policy.
    plan = models.ForeignKey(
        Plan, on_delete=models.CASCADE, null=True, blank=True, related_name="signing_requests"
    )
    action = models.ForeignKey("ActionRequest", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="signing_requests")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64, unique=True)
    decision = models.CharField(max_length=10)  # approve | reject
    choices = models.JSONField(default=dict, blank=True)
    overrides = models.JSONField(default=dict, blank=True)  # item position -> why overwrite
    reason = models.TextField(blank=True)
    digest = models.CharField(max_length=64)
    challenge = models.CharField(max_length=64, help_text="base64url of the 32 bytes the passkey signs")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.decision} request by {self.user} on {self.plan or self.action}"


class Approval(models.Model):
    """A signed decision on a plan: the assertion, the content it covered, and when it stops counting."""

    class Decision(models.TextChoices):
        APPROVE = "approve", "Approved"
        REJECT = "reject", "Rejected"

    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="approvals")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    passkey = models.ForeignKey(Passkey, on_delete=models.PROTECT, related_name="approvals")
    decision = models.CharField(max_length=10, choices=Decision.choices)
    reason = models.TextField(blank=True)
    digest = models.CharField(max_length=64)
    choices = models.JSONField(default=dict, blank=True)
    overrides = models.JSONField(default=dict, blank=True)  # item position -> why overwrite (in `content`)
    content = models.JSONField(help_text="The plan's content as signed, to show what changed since.")
    nonce = models.CharField(max_length=64, unique=True)
    challenge = models.CharField(max_length=64)
    assertion = models.JSONField(help_text="The WebAuthn assertion as the browser sent it.")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["plan", "created_at"]

    def __str__(self):
        return f"{self.get_decision_display()} by {self.approver} on {self.plan}"
