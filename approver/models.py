"""The approval side's state: reversal plans and their items, passkeys and approvals, autonomy policies and
the calls they hold. Every change goes through `approver.services`."""

import uuid
from datetime import timedelta

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from journal.models import Run, Step
from journal.ports import DEFAULT_HOLD_SECONDS, HeldState

from .policy import CLASS_WORDS


class PlanQuerySet(models.QuerySet):
    def open(self):
        return self.filter(state__in=Plan.OPEN_STATES)

    def for_page(self):
        return self.select_related("run__agent__on_behalf_of", "requested_by", "compensation_run")


class Plan(models.Model):
    """A request to undo part of a run, with every step it must take back, checked against the servers.

    The plan's content (`approver.content.plan_content`) is what an approver signs; `digest` is the
    SHA-256 of its JCS bytes and changes whenever the content does."""

    class State(models.TextChoices):
        DRAFT = "draft", "Draft"
        CHECKING = "checking", "Checking"
        READY = "ready", "Ready for sign-off"
        APPROVED = "approved", "Approved"
        EXECUTING = "executing", "Executing"
        PAUSED = "paused", "Paused"
        COMPLETED = "completed", "Completed"
        PARTIALLY_COMPLETED = "partially_completed", "Partially completed"
        FAILED = "failed", "Failed"
        REJECTED = "rejected", "Rejected"
        EXPIRED = "expired", "Expired"
        CANCELLED = "cancelled", "Cancelled"
        SUPERSEDED = "superseded", "Superseded"

    # Where each move starts from: the services' conditional updates and the pages' buttons read these.
    OPEN_STATES = (State.DRAFT, State.CHECKING, State.READY, State.APPROVED, State.EXECUTING, State.PAUSED)
    FINISHED_STATES = (State.COMPLETED, State.PARTIALLY_COMPLETED, State.FAILED)
    CHECKABLE_STATES = (State.DRAFT, State.READY)
    CANCELLABLE_STATES = (State.DRAFT, State.CHECKING, State.READY)
    RUNNABLE_STATES = (State.APPROVED, State.EXECUTING)  # a worker may take it (and pause it)
    STOPPABLE_STATES = (State.APPROVED, State.EXECUTING, State.PAUSED)  # abortable; a reconciler looks at it
    DECIDED_STATES = (State.APPROVED, State.REJECTED, State.EXECUTING, State.PAUSED, *FINISHED_STATES)

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="plans")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(blank=True)
    # What was asked: "from step N onwards", or a chosen set of step numbers.
    from_step = models.PositiveIntegerField(null=True, blank=True)
    chosen_steps = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=24, choices=State.choices, default=State.DRAFT)
    digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # Counters the progress line reads without an aggregate: items to check, and how many have an answer.
    checks_total = models.PositiveIntegerField(default=0)
    checks_done = models.PositiveIntegerField(default=0)
    # Each round of checks has a number; a task works for one round only, so a late or duplicate task
    # cannot mix its answers into a newer round.
    check_round = models.PositiveIntegerField(default=0)
    checked_at = models.DateTimeField(null=True, blank=True)
    # Which round's "ready" the approvers were told of, and whether the requester heard the outcome: claimed by
    # a conditional update, so a notification task run twice sends once.
    ready_notified_round = models.PositiveIntegerField(default=0)
    # Execution's report line ("Reversed 2 of 3 actions; 1 cannot be undone") and why it stopped, if it did.
    execution_summary = models.CharField(max_length=300, blank=True)
    stop_reason = models.TextField(blank=True)
    # Set (to the digest it covered) when no human had to sign: the autonomy policies let it run alone.
    approved_by_policy = models.CharField(max_length=64, blank=True)
    paused_by = models.CharField(max_length=150, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    # The executor's compensation calls, journaled like any agent's calls in a run of their own.
    compensation_run = models.OneToOneField(Run, on_delete=models.PROTECT, null=True, blank=True,
                                            related_name="compensates_plan")
    outcome_notified = models.BooleanField(default=False)
    execution_notified = models.BooleanField(default=False)
    # Items that will be undone / cannot be / changed since: kept with the items so lists need no aggregate.
    compensate_count = models.PositiveIntegerField(default=0)
    cannot_undo_count = models.PositiveIntegerField(default=0)
    conflict_count = models.PositiveIntegerField(default=0)

    objects = PlanQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"plan {self.public_id}"

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES

    @property
    def selection_text(self) -> str:
        if self.from_step is not None:
            return f"from step {self.from_step}"
        return "steps " + ", ".join(str(n) for n in self.chosen_steps)


class PlanItem(models.Model):
    """One step of the run in the plan: what undoing it means, how the check went, and (later) how it ran."""

    class Action(models.TextChoices):
        COMPENSATE = "compensate", "Will be undone"
        CANNOT_UNDO = "cannot_undo", "Cannot be undone"
        NOTHING_TO_UNDO = "nothing_to_undo", "Nothing to undo"
        ALREADY_UNDONE = "already_undone", "Already undone"

    class Rule(models.TextChoices):
        # Why the step is in the plan (DESIGN.md's dependency rules, plus the user's own choice).
        CHOSEN = "chosen", "Chosen"
        ALL_EARLIER = "all-earlier", "All-earlier rule"
        INFERRED = "inferred", "Inferred from values"
        DECLARED = "declared", "Declared"

    class Check(models.TextChoices):
        NOT_NEEDED = "", "Not checked"
        PENDING = "pending", "Waiting"
        OK = "ok", "Would work now"
        CONFLICT = "conflict", "Changed since"
        EXPIRED = "expired", "Window closed"
        UNAVAILABLE = "unavailable", "Unavailable"
        ERROR = "error", "Error"

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="items")
    step = models.ForeignKey(Step, on_delete=models.PROTECT, related_name="plan_items")
    # 1 is undone first: reverse completion order.
    position = models.PositiveIntegerField()
    action = models.CharField(max_length=20, choices=Action.choices)
    rule = models.CharField(max_length=20, choices=Rule.choices)
    pulled_in_by = models.PositiveIntegerField(null=True, blank=True, help_text="The step whose dependency added this one.")
    pointers = models.JSONField(default=list, blank=True)
    # The compensation exactly as it would run: tool, resolved arguments, ifVersion, idempotency key.
    tool = models.CharField(max_length=200, blank=True)
    arguments = models.JSONField(null=True, blank=True)
    if_version = models.CharField(max_length=200, blank=True)
    idempotency_key = models.CharField(max_length=100, blank=True)
    dialect = models.CharField(max_length=20, blank=True)
    via = models.CharField(max_length=10, blank=True)
    side_effect = models.TextField(blank=True)
    cost = models.JSONField(null=True, blank=True)
    undo_by = models.DateTimeField(null=True, blank=True)
    # Set when a compensation can run but only a human may decide it should (no version was reported).
    needs_human = models.TextField(blank=True)
    # For cannot_undo (and nothing/already): why, and a remedy that is shown and never performed.
    reason = models.TextField(blank=True)
    remedy = models.TextField(blank=True)
    check_status = models.CharField(max_length=12, choices=Check.choices, blank=True)
    check_detail = models.JSONField(default=dict, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    class Choice(models.TextChoices):
        # The approver's answer to a conflict (DESIGN.md): part of the content they sign.
        NONE = "", "Not chosen"
        KEEP_NEWER = "keep_newer", "Keep the newer change (skip this undo)"
        OVERWRITE = "overwrite", "Overwrite the version I saw"

    conflict_choice = models.CharField(max_length=12, choices=Choice.choices, blank=True)

    class Exec:  # `exec_state`'s values: "" until claimed, running while in flight, done once its outcome is kept
        NOT_STARTED, RUNNING, DONE = "", "running", "done"

    exec_state = models.CharField(max_length=10, blank=True)
    outcome = models.CharField(max_length=24, blank=True)  # "compensated" makes the step "already undone" later
    outcome_detail = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # After a failure that is safe to repeat, the item is let go until then (Celery rings again at that time).
    retry_at = models.DateTimeField(null=True, blank=True)
    # The latest journaled call of this compensation, a step of the plan's compensation run.
    call_step = models.ForeignKey(Step, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    exec_started_at = models.DateTimeField(null=True, blank=True)
    exec_finished_at = models.DateTimeField(null=True, blank=True)
    # True while the plan is open: a step can be in at most one open plan (the constraint below).
    holds_step = models.BooleanField(default=True)

    class Meta:
        ordering = ["plan", "position"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "position"], name="unique_item_position_per_plan"),
            models.UniqueConstraint(fields=["step"], condition=models.Q(holds_step=True),
                                    name="one_open_plan_per_step"),
        ]

    def __str__(self):
        return f"{self.plan} item {self.position}"


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
    """Who may approve and how many must: one row, which admins edit. `ApprovalRules.current()` reads it,
    with these defaults if nobody has saved it yet."""

    approver_role = models.CharField(max_length=80, default="approver",
                                     help_text="The group whose members may approve or reject plans.")
    quorum = models.PositiveSmallIntegerField(default=2, validators=[MinValueValidator(1)],
                                              help_text="Distinct approvers needed before a plan may run.")
    valid_for = models.DurationField(default=timedelta(hours=24),
                                     help_text="How long an approval counts (never past the plan's first undo deadline).")
    separation_of_duties = models.BooleanField(
        default=True, help_text="The person who asked for the plan and the person the agent acted for cannot approve it.")

    class Meta:
        verbose_name = verbose_name_plural = "approval rules"

    def __str__(self):
        return f"{self.quorum} approver(s) from {self.approver_role}, valid {self.valid_for}"

    @classmethod
    def current(cls) -> "ApprovalRules":
        return cls.objects.filter(pk=1).first() or cls(pk=1)


class SigningRequest(models.Model):
    """A one-time challenge handed to an approver's browser: what they are about to sign."""

    # What is being signed: a plan, or a call held by an autonomy policy.
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, null=True, blank=True, related_name="signing_requests")
    action = models.ForeignKey("ActionRequest", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="signing_requests")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64, unique=True)
    decision = models.CharField(max_length=10)  # approve | reject
    choices = models.JSONField(default=dict, blank=True)
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


# -- autonomy policies --------------------------------------------------------------------------------------

ALREADY_COVERED = "Another policy already covers this; edit that one instead."


class AutonomyPolicy(models.Model):
    """What the Recorder does with an agent's call, by what its server says about undoing it (approver.policy):
    allow, ask a human first, or deny. The most specific policy that matches a call governs it. Changed only
    through `services.save_policy` / `services.delete_policy`, which keep the tamper-evident change log."""

    class Scope(models.TextChoices):
        EVERYTHING = "everything", "Every call"
        AGENT = "agent", "One agent"
        SERVER = "server", "One tool server"
        TOOL = "tool", "One tool"

    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=12, choices=Scope.choices)
    agent = models.ForeignKey("journal.Agent", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    server = models.ForeignKey("journal.ToolServer", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    tool = models.CharField(max_length=200, blank=True)
    decisions = models.JSONField(help_text="allow | ask | deny for each class of call (approver.policy.CLASSES).")
    approver_group = models.CharField(max_length=150, default="approver",
                                      help_text="The group whose members approve held calls.")
    quorum = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    ask_timeout = models.PositiveIntegerField(default=DEFAULT_HOLD_SECONDS, help_text="Seconds a held call waits for approval.")
    auto_run_plans = models.BooleanField(
        default=False, help_text="Reversal plans whose items are all compensate-via-api, with no conflict, side "
                                 "effect or cost, run without a human.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["scope", "name"]
        verbose_name_plural = "autonomy policies"
        constraints = [
            models.UniqueConstraint(fields=["scope"], condition=models.Q(scope="everything"),
                                    name="one_policy_for_everything", violation_error_message=ALREADY_COVERED),
            models.UniqueConstraint(fields=["agent"], condition=models.Q(scope="agent"), name="one_policy_per_agent",
                                    violation_error_message=ALREADY_COVERED),
            models.UniqueConstraint(fields=["server"], condition=models.Q(scope="server"),
                                    name="one_policy_per_server", violation_error_message=ALREADY_COVERED),
            models.UniqueConstraint(fields=["server", "tool"], condition=models.Q(scope="tool"),
                                    name="one_policy_per_tool", violation_error_message=ALREADY_COVERED),
        ]

    def __str__(self):
        return self.name


class PolicyChange(models.Model):
    """One change to the autonomy policies (who, when, before and after), hash-chained like a run record
    (journal.chain: seq, ts, event, data, prevHash, hash) and with each head signed by the Recorder's key,
    so an edit, a removal or a cut tail shows."""

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


class ActionRequest(models.Model):
    """A call the Recorder holds because its policy says `ask`: the exact call (server, tool, arguments, _meta)
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
    meta = models.JSONField(null=True, blank=True, help_text="The _meta sent, as approved (plus the Recorder's key).")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the JCS of {agent, server, tool, arguments, meta}.")
    call_class = models.CharField(max_length=30)
    reason = models.TextField(help_text="The policy's decision, in words.")
    why = models.JSONField(default=dict, blank=True, help_text="The server's own reason and remedy.")
    policy = models.ForeignKey(AutonomyPolicy, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
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
        constraints = [models.UniqueConstraint(fields=["request", "approver"], name="one_decision_per_approver")]

    def __str__(self):
        return f"{self.get_decision_display()} by {self.approver} on {self.request}"
