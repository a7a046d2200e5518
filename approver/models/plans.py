"""Reversal plans and their items: what to undo, in which order, how each check and compensation went."""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from journal.models import Run, Step
from journal.undo.recipe_text import recipe_title

from ..execution import OUTCOME_WORDS
from ..planning import inclusion_words
from ..wording import choice_words, database_choice_words, undo_words


def since_words(moment) -> str:
    """A moment as a plan names it: "2026-12-02 03:10:00 UTC", in the site's time zone, to the second."""
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z")


class PlanQuerySet(models.QuerySet):
    def open(self):
        return self.filter(state__in=Plan.OPEN_STATES)

    def for_page(self):
        return self.select_related("run__agent__on_behalf_of", "run__team", "requested_by",
                                   "compensation_run", "rest_of")


class Plan(models.Model):
    """A request to undo part of a run, with every step it must take back, checked against the servers.

    The plan's content (`approver.content.plan_content`) is what an approver signs; `digest` is the
    SHA-256 of its JCS bytes and changes whenever the content does."""

    class State(models.TextChoices):
        DRAFTING = "drafting", "Drafting"  # the worker reads the run and writes the items (`draft_plan`)
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
    OPEN_STATES = (
        State.DRAFTING,
        State.DRAFT,
        State.CHECKING,
        State.READY,
        State.APPROVED,
        State.EXECUTING,
        State.PAUSED,
    )
    FINISHED_STATES = (State.COMPLETED, State.PARTIALLY_COMPLETED, State.FAILED)
    CHECKABLE_STATES = (State.DRAFT, State.READY)
    CANCELLABLE_STATES = (State.DRAFTING, State.DRAFT, State.CHECKING, State.READY)
    RUNNABLE_STATES = (State.APPROVED, State.EXECUTING)  # a worker may take it (and pause it)
    STOPPABLE_STATES = (State.APPROVED, State.EXECUTING, State.PAUSED)  # abortable; a reconciler looks at it
    DECIDED_STATES = (State.APPROVED, State.REJECTED, State.EXECUTING, State.PAUSED, *FINISHED_STATES)

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # The run asked about. A plan of everything an agent did since a moment (`since`) covers several runs:
    # this is the first of them (its record takes the plan's events), and `runs` lists them all.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="plans")
    runs = models.ManyToManyField(Run, related_name="undo_plans", blank=True)
    since = models.DateTimeField(null=True, blank=True)
    # "Plan the rest": the plan that stopped short, whose steps not yet undone this one takes up (its
    # report links here; this one's page links back).
    rest_of = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True,
                                related_name="rest_plans")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField(blank=True)
    # What was asked: "from step N onwards", or a chosen set of step numbers (or, above, since a moment).
    from_step = models.PositiveIntegerField(null=True, blank=True)
    chosen_steps = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=24, choices=State.choices, default=State.DRAFT)
    digest = models.CharField(max_length=64, blank=True)
    # The content the approvers' latest "ready for sign-off" message showed: a link from it carries its
    # digest, and a plan opened from it after a change says what changed since the message was sent.
    messaged_digest = models.CharField(max_length=64, blank=True)
    messaged_content = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # Drafting's progress (items written of the plan's steps), and since when a worker has been at it.
    draft_total = models.PositiveIntegerField(default=0)
    draft_done = models.PositiveIntegerField(default=0)
    drafting_since = models.DateTimeField(null=True, blank=True)
    # Counters the progress line reads without an aggregate: items to check, and how many have an answer.
    checks_total = models.PositiveIntegerField(default=0)
    checks_done = models.PositiveIntegerField(default=0)
    # Each round of checks has a number; a task works for one round only, so a late or duplicate task
    # cannot mix its answers into a newer round.
    check_round = models.PositiveIntegerField(default=0)
    checked_at = models.DateTimeField(null=True, blank=True)
    # Which round's "ready" the approvers were told of, and whether the requester heard the outcome: claimed
    # by
    # a conditional update, so a notification task run twice sends once.
    ready_notified_round = models.PositiveIntegerField(default=0)
    ready_notified_at = models.DateTimeField(null=True, blank=True)
    # Opened by a saga policy after a failed call (`services.sagas`): capped per agent, and its approvers are
    # told in batches (`tasks.notify_saga_plans`).
    saga = models.BooleanField(default=False)
    # Execution's report line ("Reversed 2 of 2 actions; 1 cannot be undone") and why it stopped, if it did.
    execution_summary = models.CharField(max_length=300, blank=True)
    stop_reason = models.TextField(blank=True)
    # Set (to the digest it covered) when no human had to sign: the autonomy policies let it run alone.
    approved_by_policy = models.CharField(max_length=64, blank=True)
    # The W3C traceparent of the span that asked for the plan: its later parts (draft, checks, signatures,
    # compensations) join that trace (`approver.traced`). Empty while tracing is off.
    trace_context = models.CharField(max_length=200, blank=True)
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

    def not_yet_undone(self):
        """Its items with a compensation that did not take effect (skipped, failed, left alone on a conflict,
        or not known): what "Plan the rest" takes up, once none is unknown."""
        return self.items.filter(action=PlanItem.Action.COMPENSATE).exclude(outcome="compensated")

    @property
    def selection_text(self) -> str:
        if self.rest_of_id is not None:
            return f"the rest of plan {str(self.rest_of.public_id)[:8]}"
        if self.since is not None:
            return "since " + since_words(self.since)
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
        # Why the step is in the plan (docs/design.md's dependency rules, plus the user's own choice).
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
    pulled_in_by = models.PositiveIntegerField(
        null=True, blank=True, help_text="The step whose dependency added this one."
    )
    pointers = models.JSONField(default=list, blank=True)
    # The compensation exactly as it would run: tool, resolved arguments, ifVersion, idempotency key.
    tool = models.CharField(max_length=200, blank=True)
    arguments = models.JSONField(null=True, blank=True)
    # A recipe's further calls, made in order after the first: [{"tool", "arguments"}], signed with it.
    then = models.JSONField(default=list, blank=True)
    if_version = models.CharField(max_length=200, blank=True)
    # `undo:<plan>:<run>:<step>:<mac>` for a plan across runs: 36 + 36 + 32 characters and the step number.
    idempotency_key = models.CharField(max_length=200, blank=True)
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
        # The approver's answer to a conflict (docs/design.md): part of the content they sign.
        NONE = "", "Not chosen"
        KEEP_NEWER = "keep_newer", "Keep the newer change (skip this undo)"
        OVERWRITE = "overwrite", "Overwrite the version I saw"

    conflict_choice = models.CharField(max_length=12, choices=Choice.choices, blank=True)
    # An overwrite is an override, asked for by name: why (signed, in the content), who asked and when.
    override_reason = models.TextField(blank=True)
    override_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                    related_name="+")
    override_at = models.DateTimeField(null=True, blank=True)

    # `exec_state`'s values: "" until claimed, running while in flight, done once its outcome is kept
    class Exec:
        NOT_STARTED, RUNNING, DONE = "", "running", "done"

    exec_state = models.CharField(max_length=10, blank=True)
    outcome = models.CharField(
        max_length=24, blank=True
    )  # "compensated" makes the step "already undone" later
    outcome_detail = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # After a failure that is safe to repeat, the item is let go until then (Celery rings again at that time).
    retry_at = models.DateTimeField(null=True, blank=True)
    # The latest journaled call of this compensation, a step of the plan's compensation run.
    call_step = models.ForeignKey(Step, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    exec_started_at = models.DateTimeField(null=True, blank=True)
    exec_finished_at = models.DateTimeField(null=True, blank=True)
    # The record its compensation will change, as its lease names it: the step's `effect.resource`, or for
    # an admin's recipe the read that names the record ("" when there is none).
    record = models.CharField(max_length=500, blank=True)
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

    @property
    def why_included(self) -> str:
        return inclusion_words(self.rule, self.pulled_in_by, self.pointers)

    @property
    def undo_words(self) -> str:
        """What undoing the step does, as the change it makes (its server's own words come first, when the
        check gave them)."""
        if self.dialect == "recipe" and (title := recipe_title(self.step.earlier_state)):
            chained = ((self.check_detail or {}).get("wouldDo") or "").partition(", once ")[2]
            return f"{title}, once {chained}" if chained else title
        detail = self.check_detail or {}
        words = detail.get("wouldDo") or undo_words(self.step.effect_summary, self.step.effect_fields)
        return f"{words or 'Undo ' + self.step.tool}, {detail['chained']}" if detail.get("chained") else words

    @property
    def choice_words(self) -> dict[str, str]:
        """What each answer to its conflict does to the record, in words (`wording.choice_words`)."""
        detail = self.check_detail or {}
        if self.dialect == "database":
            return database_choice_words(detail)
        does = ((self.step.earlier_state or {}).get("does") or "its recipe's undo") \
            if self.dialect == "recipe" else ""
        return choice_words(((detail.get("threeWay") or {}).get("fields")) or [],
                            (detail.get("current") or {}).get("changedBy") or "", recipe=does)

    @property
    def override_words(self) -> str:
        """Who asked to overwrite whose newer change: "ana asked to overwrite priya's newer change"."""
        by = ((self.check_detail or {}).get("current") or {}).get("changedBy") or ""
        asker = self.override_by.get_username() if self.override_by_id else "an approver"
        return f"{asker} asked to overwrite {by + chr(39) + 's' if by else 'the'} newer change"

    @property
    def outcome_words(self) -> str:
        return OUTCOME_WORDS.get(self.outcome, self.outcome)
