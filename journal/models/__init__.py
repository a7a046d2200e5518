"""Tool servers, agents, runs, steps and the hash-chained run record; what OAuth clients are to the Recorder
is in `clients`.

Writes go through `journal.services`; these modules hold state, invariants and read helpers only.
"""

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from ..ports import HeldEnd
from ..undo import recovery
from .audit import AuditPosition as AuditPosition  # re-exported: one place to import from
from .audit import AuditSink as AuditSink
from .audit import Notice as Notice
from .clients import ClientAuthorization as ClientAuthorization
from .clients import RedeemedCode as RedeemedCode
from .identities import ProviderIdentity as ProviderIdentity
from .record_json import RecordJSONField as RecordJSONField  # re-exported: migrations name it here
from .servers import ToolServer as ToolServer
from .teams import Team as Team


class Agent(models.Model):
    name = models.SlugField(max_length=60, unique=True)
    on_behalf_of = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agents"
    )
    # Whose agent it is: its team's people see its runs, plan their undo and sign (`journal.auth.teams`).
    # Moved only through `services.move_agent`, which moves its runs with it.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="agents",
                             help_text="Its team's people see its runs, undo them and approve.")
    # SHA-256 of the bearer token; the token itself is shown once and never stored.
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12, help_text="The first characters, to tell tokens apart.")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A failed call under a saga policy halts its run and the agent with it (a new runId must not sidestep
    # the halt): the plan undoing that run, while it is open, and why. Written with the run's halt
    # (`services.halt_run`, `services.runs.release`).
    halted_by_plan = models.CharField(max_length=36, blank=True)
    halted_reason = models.TextField(blank=True)
    # For a framework that drops `_meta` (LangChain's ToolMessage, pydantic-ai's tool return), a failed call's
    # advice is added to its content as a short text block too. Off by default: faithful adds nothing.
    advice_in_content = models.BooleanField(
        default=False, help_text="Add the advice on a failed call to its content too.")
    # Off for an agent minted on the consent page by an account with no role, until an admin turns it on.
    asks_approvers = models.BooleanField(default=True, help_text=(
        "Calls a policy would hold for approvers are held; when off, they are refused and nobody is asked."))

    class RunsBy(models.TextChoices):
        # How its calls form runs (an agent's own runId always wins): per MCP session, with the idle gap for
        # calls that have none; or by the idle gap alone, for frameworks that open a session per tool call
        # (langchain-mcp-adapters, LlamaIndex), whose every call would otherwise be a run of its own; or by
        # the agent's runId only, never merged by a session or the idle gap (a call without one is its own).
        SESSION = "session", "per MCP session (else by the idle gap)"
        IDLE = "idle", "by the idle gap, across sessions"
        RUN_ID = "run_id", "by its runId only (a call without one is a run of its own)"

    runs_by = models.CharField(max_length=10, choices=RunsBy.choices, default=RunsBy.SESSION)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class AgentSession(models.Model):
    """An agent's MCP session on the initialize handshake, as every Recorder process needs it: whose it is,
    the protocol version it negotiated and what the agent declared, so any process answers any request of
    it (`journal.mcp.sessions`). Gone once the agent ends the session, or unused for the idle time."""

    session_id = models.CharField(max_length=100, unique=True)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sessions")
    protocol_version = models.CharField(max_length=20)
    client_info = models.JSONField(default=dict)
    capabilities = models.JSONField(default=dict)
    opened_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(default=timezone.now)  # to within a minute (`sessions.TOUCH_SECONDS`)

    def __str__(self):
        return f"session {self.session_id[:8]} of agent {self.agent_id}"


class RunQuerySet(models.QuerySet):
    def for_list(self):
        return self.select_related("agent", "agent__on_behalf_of", "team")


class Run(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        FAILED = "failed", "Has failed calls"
        IMPORTED = "imported", "Imported"

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs", null=True, blank=True)
    # Its agent's team (an imported run's is the importer's choice): who may see and undo it. Kept here, not
    # read through the agent, so imported runs have one too and every list filters on one column.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="runs")
    # How the Recorder found this run again: the agent's runId, its MCP session id, or nothing (idle rule).
    key = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.ACTIVE)
    started_at = models.DateTimeField(default=timezone.now)
    last_activity_at = models.DateTimeField(default=timezone.now)
    # A run found by the idle rule that an on-call user ended: the agent's next call starts a new one.
    ended_at = models.DateTimeField(null=True, blank=True)
    # Counters kept with each step so the run list needs no aggregate per row.
    step_count = models.PositiveIntegerField(default=0)
    reversible_count = models.PositiveIntegerField(default=0)
    irreversible_count = models.PositiveIntegerField(default=0)
    unknown_count = models.PositiveIntegerField(default=0)
    failed_count = models.PositiveIntegerField(default=0)
    # Chain head, updated under the run's row lock with every entry appended.
    head_seq = models.PositiveIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default="GENESIS")
    checkpointed_seq = models.PositiveIntegerField(default=0)
    # A run being unwound after a failed call (a saga policy): the plan that does it. The agent's further
    # calls
    # in the run are refused while that plan is open, until it ends or a person releases the run.
    halted_by_plan = models.CharField(max_length=36, blank=True)
    halted_reason = models.TextField(blank=True)
    # For runs imported from elsewhere: where they came from.
    imported_from = models.CharField(max_length=200, blank=True)
    agent_label = models.CharField(max_length=200, blank=True, help_text="Agent name for imported runs.")

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["agent", "key", "-last_activity_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "key"], condition=~models.Q(key="") & ~models.Q(key__startswith="idle:"),
                name="unique_run_key_per_agent"
            )
        ]

    def __str__(self):
        return f"run {self.public_id}"

    @property
    def agent_name(self) -> str:
        return self.agent.name if self.agent_id else self.agent_label


class Step(models.Model):
    class Reversibility(models.TextChoices):
        COMPENSATE = "compensate", "Reversible"
        NONE = "none", "Cannot be undone"
        UNKNOWN = "unknown", "Unknown"
        READ_ONLY = "read_only", "Read-only"

    class Status(models.TextChoices):
        PENDING = "pending", "In flight"
        HELD = "held", "Held for approval"
        OK = "ok", "Succeeded"
        ERROR = "error", "Failed"
        # The server answered (and may have acted), but the answer never reached the agent.
        UNDELIVERED = "undelivered", "Acted; the agent did not get the answer"
        # The agent cancelled while the server had the call: it may or may not have acted.
        CANCELLED = "cancelled", "Cancelled by the agent"

    class FailureClass(models.TextChoices):
        # MCP-Rescue's categories.
        TRANSIENT = "transient", "Transient"
        INVALID_ARGUMENTS = "invalid_arguments", "Invalid arguments"
        AUTHENTICATION = "authentication", "Authentication"
        PERMISSION = "permission", "Permission"
        NOT_FOUND = "not_found", "Not found"
        CONFLICT = "conflict", "Conflict"
        BUSINESS_RULE = "business_rule", "Business rule"
        # The server does not do this for this client: its protocol version or declared capabilities.
        UNSUPPORTED = "unsupported", "Not on this protocol"
        UNKNOWN = "unknown", "Unknown"
        POLICY = "policy", "Stopped by an autonomy policy"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    number = models.PositiveIntegerField()
    server = models.ForeignKey(ToolServer, models.PROTECT, related_name="steps", null=True, blank=True)
    server_name = models.CharField(max_length=60)
    tool = models.CharField(max_length=200)
    arguments = RecordJSONField(default=dict)
    request_meta = models.JSONField(null=True, blank=True)
    class ResultStorage(models.TextChoices):
        INLINE = "inline", "Kept with the step"
        JOURNAL = "journal", "Kept in the run's record only"
        DROPPED = "dropped", "Over the size limit; not kept"

    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING)
    # A small result is kept here and in the run's record; a large one only in the record (its `result`
    # entry), so its bytes are stored once and listing steps never reads it.
    result = RecordJSONField(null=True, blank=True)
    result_storage = models.CharField(max_length=8, choices=ResultStorage.choices, blank=True)
    result_size = models.PositiveBigIntegerField(null=True, blank=True, help_text="Bytes of the answer.")
    result_sha256 = models.CharField(max_length=64, blank=True)
    result_seq = models.PositiveIntegerField(
        null=True, blank=True, help_text="The run record's entry of the result.")
    is_error = models.BooleanField(default=False)
    error_message = models.TextField(blank=True)
    failure_class = models.CharField(max_length=20, choices=FailureClass.choices, blank=True)
    # The server had the call and its outcome is not known (no answer, cancelled while it had it), or it
    # answered and the agent never saw the answer: a repeat of the same call may act twice (the retry guard).
    may_have_acted = models.BooleanField(default=False)
    # What the agent was advised to do about a failure (journal.undo.recovery.Advice.as_wire).
    recovery = models.JSONField(null=True, blank=True)
    # SHA-256 of the agent, server, tool and arguments, to find an earlier attempt of the same call.
    call_digest = models.CharField(max_length=64, blank=True, db_index=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    # The normalised UndoDeclaration (journal.undo.declarations) and what it means for this call.
    declaration = models.JSONField(default=dict)
    declaration_source = models.CharField(max_length=40, blank=True)
    reversibility = models.CharField(
        max_length=12, choices=Reversibility.choices, default=Reversibility.UNKNOWN
    )
    compensation_arguments = RecordJSONField(null=True, blank=True)
    # A recipe's further compensating calls, in order, each {"tool", "arguments"} resolved like the first.
    compensation_then = RecordJSONField(null=True, blank=True)
    undo_problems = models.JSONField(default=list, blank=True)
    # An admin's recipe read the record just before the call was sent (journal.undo.recipes): what it read,
    # the version of it, and its size and digest; the answer itself only when within the inline bound.
    earlier_state = RecordJSONField(null=True, blank=True)
    effect_summary = models.CharField(max_length=500, blank=True)
    effect_resource = models.CharField(max_length=500, blank=True)
    effect_version = models.CharField(max_length=200, blank=True)
    # For a change made through an app's screens: what its version fingerprints (screen and visible fields).
    effect_fingerprint = models.JSONField(null=True, blank=True)
    # The changed fields' values before and after the call, when its server gave them (HATP's optional
    # `effect.before`/`after`): {"before", "after"}, with "unreadable" when what it sent could not be shown.
    effect_fields = RecordJSONField(null=True, blank=True)
    compensation_token = models.CharField(max_length=500, blank=True)
    undo_by = models.DateTimeField(null=True, blank=True)
    receipt = models.JSONField(null=True, blank=True)
    receipt_verified = models.BooleanField(null=True, help_text="None when the call carried no receipt.")
    receipt_problem = models.CharField(max_length=300, blank=True)
    # What the autonomy policy decided before the call was forwarded (approver.policy.Decision.as_record).
    policy_decision = models.JSONField(null=True, blank=True)
    # The server answered with a task handle (the MCP tasks extension): the step stays in flight under the
    # server's task id until the task's end is seen, or its time to live (`task_until`, None: unlimited) ends.
    task_id = models.CharField(max_length=200, blank=True, db_index=True)
    task_until = models.DateTimeField(null=True, blank=True)
    # The Recorder process following that task marks it at every look: one not marked for a while has
    # nobody following it, and another process takes it over (`mcp.task_follower`).
    task_seen_at = models.DateTimeField(null=True, blank=True)
    # While a call is held for approval, the process holding it marks it every few seconds: a held step not
    # marked for a while has nobody waiting on it (its Recorder stopped), and the reconciler settles it.
    held_seen_at = models.DateTimeField(null=True, blank=True)
    # The held call (its public id on the approval side) this step waited on: identical calls share one.
    held_call = models.CharField(max_length=36, blank=True)
    # The agent has this held call as a task (`mcp.held_tasks`): whichever Recorder process is running waits
    # for its decision and sends it, taking it over when the one that held it stops marking it.
    held_task = models.BooleanField(default=False)
    # How an attempt that was held and never sent ended (`ports.HeldEnd`), set with its refusal.
    held_end = models.CharField(max_length=8, choices=HeldEnd.CHOICES, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="unique_step_number_per_run")]

    def __str__(self):
        return f"step {self.number} {self.server_name}__{self.tool}"

    @property
    def namespaced_tool(self) -> str:
        return f"{self.server_name}__{self.tool}"

    @property
    def advised(self) -> str:
        """What the agent was advised to do about this failed call, in words."""
        action = (self.recovery or {}).get("action") if isinstance(self.recovery, dict) else None
        return recovery.ACTION_WORDS.get(action, action or "")

    @property
    def automatically_undoable(self) -> bool:
        return self.reversibility == self.Reversibility.COMPENSATE and not self.undo_problems

    @property
    def badge(self) -> tuple[str, str]:
        """(css class, words) for the reversibility badge on the run page."""
        if self.reversibility == self.Reversibility.COMPENSATE:
            if self.undo_problems:
                return "needs-human", "Reversible with a human"
            via = self.declaration.get("via") or "api"
            words = "Reversible through the app's screens" if via == "ui" else "Reversible via the API"
            return "reversible", words
        return {
            self.Reversibility.NONE: ("irreversible", "Cannot be undone"),
            self.Reversibility.READ_ONLY: ("read-only", "Read-only"),
        }.get(self.reversibility, ("unknown", "Unknown"))


class StepDependency(models.Model):
    """A link between two steps found by inference or declared by the agent.

    The safe default rule (every later step depends on every earlier one) is not stored: it holds for
    every pair, and storing it would cost n² rows on a long run.
    """

    class Rule(models.TextChoices):
        INFERRED = "inferred", "Inferred from values"
        DECLARED = "declared", "Declared"

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="dependencies")
    depends_on = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="dependents")
    rule = models.CharField(max_length=10, choices=Rule.choices)
    # For inferred links: [{"from": pointer into the earlier result, "to": pointer into these arguments}].
    pointers = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["step", "depends_on", "rule"], name="unique_dependency_per_rule")
        ]

    def __str__(self):
        return f"{self.step} depends on {self.depends_on} ({self.rule})"


class RunValue(models.Model):
    """A distinctive value some result of a run contained: the most recent step whose result had it (and
    where), and in how many results it was, so inferring a later call's links costs one indexed lookup per
    argument value however long the run is (`journal.undo.dependencies`)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    digest = models.CharField(max_length=32)
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="+")  # the most recent one
    pointer = models.CharField(max_length=500)  # where in that step's result
    seen = models.PositiveIntegerField(default=1)  # how many of the run's results contained it

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "digest"], name="one_value_per_run")]

    def __str__(self):
        return f"{self.pointer} of step {self.step_id}"


class ChainEntry(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="entries")
    seq = models.PositiveIntegerField()
    ts = models.CharField(max_length=40)
    event = models.CharField(max_length=40)
    data = RecordJSONField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="unique_chain_seq_per_run")]

    def __str__(self):
        return f"#{self.seq} {self.event}"

    def as_wire(self) -> dict:
        return {
            "seq": self.seq, "ts": self.ts, "event": self.event, "data": self.data,
            "prevHash": self.prev_hash, "hash": self.hash,
        }


class RecorderKey(models.Model):
    """A Recorder's public key. `origin` is blank for this Recorder's own keys and names the other Recorder
    for keys that came with an imported bundle (they verify that bundle's checkpoints, and sign nothing)."""

    origin = models.CharField(max_length=500, blank=True)
    key_id = models.CharField(max_length=40)
    public_key = models.CharField(max_length=100, help_text="Raw Ed25519 public key, base64url.")
    valid_from = models.DateTimeField(default=timezone.now)
    valid_until = models.DateTimeField(null=True, blank=True, help_text="Set when a newer key replaces it.")

    class Meta:
        ordering = ["valid_from"]
        constraints = [models.UniqueConstraint(fields=["origin", "key_id"], name="unique_key_id_per_origin")]

    def __str__(self):
        return f"{self.origin or 'this Recorder'}: {self.key_id}"

    def as_wire(self) -> dict:
        return {
            "keyId": self.key_id, "alg": "Ed25519", "publicKey": self.public_key,
            "validFrom": self.valid_from.isoformat(),
            "validUntil": self.valid_until.isoformat() if self.valid_until else None,
        }


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    seq = models.PositiveIntegerField()
    head_hash = models.CharField(max_length=64)
    key_id = models.CharField(max_length=40)
    signature = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="unique_checkpoint_per_seq")]

    def __str__(self):
        return f"checkpoint #{self.seq} by {self.key_id}"

    def as_wire(self) -> dict:
        return {
            "run": str(self.run.public_id), "seq": self.seq, "headHash": self.head_hash,
            "keyId": self.key_id, "signature": self.signature,
        }
