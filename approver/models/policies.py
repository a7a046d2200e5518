"""Autonomy policies and their hash-chained change log."""

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from journal.ports import DEFAULT_HOLD_SECONDS

ALREADY_COVERED = "Another policy already covers this; edit that one instead."


class AutonomyPolicy(models.Model):
    """What the Recorder does with an agent's call, by what its server says about undoing it
    (approver.policy):
    allow, ask a human first, or deny. The most specific policy that matches a call governs it. Changed only
    through `services.save_policy` / `services.delete_policy`, which keep the tamper-evident change log."""

    class Scope(models.TextChoices):
        EVERYTHING = "everything", "Every call"
        TEAM = "team", "One team's agents"
        AGENT = "agent", "One agent"
        SERVER = "server", "One tool server"
        TOOL = "tool", "One tool"

    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=12, choices=Scope.choices)
    agent = models.ForeignKey(
        "journal.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    team = models.ForeignKey(
        "journal.Team", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    server = models.ForeignKey(
        "journal.ToolServer", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    tool = models.CharField(max_length=200, blank=True)
    decisions = models.JSONField(
        help_text="allow | ask | deny for each class of call (approver.policy.CLASSES)."
    )
    approver_group = models.CharField(max_length=150, default="approver",
                                      help_text="The group whose members approve held calls.")
    quorum = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    ask_timeout = models.PositiveIntegerField(
        default=DEFAULT_HOLD_SECONDS,
        help_text="Seconds an agent's held call waits inside its request for a decision, at most: the "
        "Recorder tells the agent it awaits approval after RECORDER_HOLD_WAIT_SECONDS (4) at the latest.",
    )
    auto_run_plans = models.BooleanField(
        default=False,
        help_text="Reversal plans whose items are all compensate-via-api, with no conflict, side "
        "effect or cost, run without a human.",
    )
    class OnFailure(models.TextChoices):
        NOTHING = "nothing", "Nothing: the agent gets its error"
        PROPOSE = "propose", "Propose an undo of the run for approvers"
        UNWIND = "unwind", "Unwind the run before answering, where no human is needed (else propose)"

    on_failure = models.CharField(
        "When a call fails",
        max_length=10,
        choices=OnFailure.choices,
        default=OnFailure.NOTHING,
        help_text="A failed call (an error from its server) stops the run: its earlier steps are undone, "
                  "most "
        "recent first, from the step the agent marked as its task's start (sagaStart) or from step 1. "
        "Unwinding runs only plans these policies let run without a human.",
    )
    allow_unknown_retries = models.BooleanField(
        "Let repeats after an unknown outcome through",
        default=False,
        help_text="A call repeated after its first attempt timed out or was cancelled while the "
        "server had it goes through without a human (only for tools where acting twice "
        "is harmless).",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["scope", "name"]
        verbose_name_plural = "autonomy policies"
        constraints = [
            models.UniqueConstraint(
                fields=["scope"],
                condition=models.Q(scope="everything"),
                name="one_policy_for_everything",
                violation_error_message=ALREADY_COVERED,
            ),
            models.UniqueConstraint(
                fields=["team"],
                condition=models.Q(scope="team"),
                name="one_policy_per_team",
                violation_error_message=ALREADY_COVERED,
            ),
            models.UniqueConstraint(
                fields=["agent"],
                condition=models.Q(scope="agent"),
                name="one_policy_per_agent",
                violation_error_message=ALREADY_COVERED,
            ),
            models.UniqueConstraint(
                fields=["server"],
                condition=models.Q(scope="server"),
                name="one_policy_per_server",
                violation_error_message=ALREADY_COVERED,
            ),
            models.UniqueConstraint(
                fields=["server", "tool"],
                condition=models.Q(scope="tool"),
                name="one_policy_per_tool",
                violation_error_message=ALREADY_COVERED,
            ),
        ]

    def __str__(self):
        return self.name


class PolicyChange(models.Model):
    """One change to the autonomy policies (who, when, before and after), hash-chained like a run record
    (journal.record.chain: seq, ts, event, data, prevHash, hash) and with each head signed by the Recorder's
    key, so an edit, a removal or a cut tail shows."""

    seq = models.PositiveIntegerField(unique=True)
    ts = models.CharField(max_length=40)
    event = models.CharField(max_length=20)  # policy_created | policy_changed | policy_deleted
    data = models.JSONField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    key_id = models.CharField(max_length=64)
    signature = models.CharField(max_length=200)

    class Meta:
        ordering = ["seq"]

    def __str__(self):
        return f"policy change {self.seq}: {self.event}"
