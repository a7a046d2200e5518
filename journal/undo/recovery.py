"""What an agent should do about a failed call: MCP-Rescue's decision, as a pure table.

MCP-Rescue turns a failure into a decision (retry, back off, repair the arguments, re-authenticate, ask the
user, stop) and leaves enforcement to the runtime. The Recorder already knows the failure's class and
whether the server may have acted (`journal.upstream.failures.ToolServerError`), and it knows the tool:
whether
it only reads, whether repeating it is harmless (MCP's `idempotentHint`), whether it can be undone. The
advice goes to the agent in `_meta["hatp/journal"]["recovery"]` and into the run record; the dangerous case
(repeating a call that may already have acted) is enforced by the retry guard (`needs_retry_guard`, and the
autonomy policies that hold such a repeat for a human).

No ORM and no clock. The table is `RULES`, read top to bottom; the first row that matches decides.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# MCP-Rescue's failure categories, and ours for a call an autonomy policy stopped.
CATEGORIES = ("transient", "invalid_arguments", "authentication", "permission", "not_found", "conflict",
              "business_rule", "unsupported", "unknown", "policy")
# MCP-Rescue's recovery actions.
RETRY, BACKOFF, REPAIR, REAUTHENTICATE, ASK_USER, STOP = (
    "retry", "backoff", "repair_arguments", "reauthenticate", "ask_user", "stop")
ACTIONS = (RETRY, BACKOFF, REPAIR, REAUTHENTICATE, ASK_USER, STOP)
ACTION_WORDS = {RETRY: "retry", BACKOFF: "try again after a pause", REPAIR: "fix the arguments",
                REAUTHENTICATE: "sign in again", ASK_USER: "ask a person", STOP: "stop"}

DEFAULT_BACKOFF_SECONDS = 2  # a transient failure where the server said nothing of when to come back
HELD_BACKOFF_SECONDS = 30  # a held call that approvers have not decided yet


@dataclass(frozen=True)
class Tool:
    """What the advice needs to know of the tool that was called (all False when the call never reached a
    known tool)."""

    read_only: bool = False
    idempotent: bool = False  # MCP's idempotentHint: repeating it with the same arguments has no more effect
    reversible: bool = False  # its server declares a compensation
    retries_allowed: bool = (
        False  # the governing autonomy policy lets repeats after an unknown outcome through
    )

    @property
    def safe_to_repeat(self) -> bool:
        return self.read_only or self.idempotent


@dataclass(frozen=True)
class Failure:
    """A failed call as the Recorder saw it. `held` is set when an autonomy policy stopped it: "denied",
    "waiting" (no decision yet), "lapsed" (the approval expired or was used) or "too_many" (not held:
    the agent has as many calls waiting as it may)."""

    category: str
    may_have_acted: bool = False
    retry_after: float | None = None  # what the server said (HTTP Retry-After), in seconds
    held: str = ""
    answered: bool = False  # the server answered (so acted), but its answer could not be relayed
    relay_failed: str = ""  # the Recorder could not put the server's question to the agent (and why)


@dataclass(frozen=True)
class Advice:
    category: str
    action: str
    retryable: bool
    why: str
    retry_after: float | None = None

    def as_wire(self) -> dict[str, Any]:
        """`_meta["hatp/journal"]["recovery"]`, as the agent and the run record get it."""
        wire: dict[str, Any] = {"category": self.category, "action": self.action, "retryable": self.retryable,
                                "why": self.why}
        if self.retry_after is not None:
            wire["retryAfter"] = self.retry_after
        return wire


@dataclass(frozen=True)
class Rule:
    name: str  # what the row is about, for tests and readers
    when: Callable[[Failure, Tool], bool]
    action: str
    retryable: bool
    why: str
    retry_after: Callable[[Failure], float | None] = lambda failure: None


def _acted_unknown(failure: Failure) -> bool:
    return failure.may_have_acted and failure.category in ("transient", "unknown")


RULES: tuple[Rule, ...] = (
    Rule(
        "denied by a policy or an approver",
        lambda f, t: f.held == "denied",
        STOP,
        False,
        "An autonomy policy or an approver said no to this call. Repeating it will be refused the same way.",
    ),
    Rule(
        "waiting for approval",
        lambda f, t: f.held == "waiting",
        BACKOFF,
        True,
        "The call awaits an approver's decision. Make the same call again later: once approved, it goes "
        "through.",
        lambda f: f.retry_after or HELD_BACKOFF_SECONDS,
    ),
    Rule(
        "too many calls waiting for approval",
        lambda f, t: f.held == "too_many",
        BACKOFF,
        True,
        "As many of this agent's calls wait for approvers as it may have at once: this one was not held. "
        "Make it again once approvers have decided on some of them.",
        lambda f: f.retry_after or HELD_BACKOFF_SECONDS,
    ),
    Rule(
        "approval lapsed",
        lambda f, t: f.held == "lapsed",
        RETRY,
        True,
        "The approval request expired or was already used. Making the call again asks anew.",
    ),
    Rule(
        "the Recorder could not put the server's question to the agent",
        lambda f, t: bool(f.relay_failed),
        ASK_USER,
        False,
        "The server asked the agent something during the call and the Recorder could not put the question "
        "to it, so the server's refusal is the Recorder's failure, not the server's rule. A person should "
        "look at it before the call is repeated.",
    ),
    Rule(
        "answered too much to relay, and it only reads",
        lambda f, t: f.answered and t.read_only,
        REPAIR,
        False,
        "The server's answer was over the Recorder's limits. Ask for less (a narrower query, a page of it).",
    ),
    Rule(
        "answered, but the answer reached no one",
        lambda f, t: f.answered,
        ASK_USER,
        False,
        "The server answered, so it acted, but its answer could not be relayed. Check what it did before "
        "anything is repeated.",
    ),
    Rule(
        "no answer, and it only reads",
        lambda f, t: _acted_unknown(f) and t.read_only,
        RETRY,
        True,
        "The server may not have answered, but the tool only reads: repeating it is harmless.",
    ),
    Rule(
        "no answer, and it is idempotent",
        lambda f, t: _acted_unknown(f) and t.idempotent,
        RETRY,
        True,
        "The first attempt may have acted, but the tool is idempotent: the same call again has no further "
        "effect.",
    ),
    Rule(
        "no answer, and a policy lets repeats through",
        lambda f, t: _acted_unknown(f) and t.retries_allowed,
        RETRY,
        True,
        "The first attempt may have acted; an autonomy policy lets repeats of this tool through.",
    ),
    Rule(
        "no answer, and it can be undone",
        lambda f, t: _acted_unknown(f) and t.reversible,
        ASK_USER,
        False,
        "The first attempt may already have acted. It can be undone, but a repeat would act twice: check "
        "what "
        "happened first. The Recorder holds a repeat for an approver.",
    ),
    Rule(
        "no answer, and it cannot be undone",
        lambda f, t: _acted_unknown(f),
        ASK_USER,
        False,
        "The first attempt may already have acted, and the tool is neither idempotent nor reversible: a "
        "person "
        "must check what happened before anything is repeated. The Recorder holds a repeat for an approver.",
    ),
    Rule(
        "it may have acted",
        lambda f, t: f.may_have_acted,
        ASK_USER,
        False,
        "The call failed after the server had it, so it may have acted. Check what happened before anything "
        "is "
        "repeated.",
    ),
    Rule(
        "transient, nothing reached the server",
        lambda f, t: f.category == "transient",
        BACKOFF,
        True,
        "A passing failure before the server acted. Try again after a pause.",
        lambda f: f.retry_after or DEFAULT_BACKOFF_SECONDS,
    ),
    Rule(
        "invalid arguments",
        lambda f, t: f.category == "invalid_arguments",
        REPAIR,
        False,
        "The server (or the Recorder) refused the arguments. Fix them before calling again.",
    ),
    Rule(
        "not found",
        lambda f, t: f.category == "not_found",
        REPAIR,
        False,
        "Something the call names does not exist. Check the names and ids before calling again.",
    ),
    Rule(
        "conflict",
        lambda f, t: f.category == "conflict",
        REPAIR,
        False,
        "The record changed since it was read. Read it again and build the call from what is there now.",
    ),
    Rule(
        # The agent signs in to the Recorder, never to the tool server: it cannot fix the Recorder's own
        # credentials there, so "sign in again" would be advice it cannot act on.
        "authentication",
        lambda f, t: f.category == "authentication",
        ASK_USER,
        False,
        "The tool server does not accept the Recorder's credentials for it, which the agent cannot renew: "
        "an admin must (the server's registration on the Recorder). Calling again will fail the same way.",
    ),
    Rule(
        "permission",
        lambda f, t: f.category == "permission",
        ASK_USER,
        False,
        "The credentials may not do this. A person must grant access or do it themselves.",
    ),
    Rule(
        "not on this protocol",
        lambda f, t: f.category == "unsupported",
        ASK_USER,
        False,
        "The server does not do this for this client, on the protocol version or with the capabilities it "
        "declared: calling again will fail the same way. A person must decide (another client, or an admin "
        "to look at the server's registration).",
    ),
    Rule(
        "business rule",
        lambda f, t: f.category == "business_rule",
        STOP,
        False,
        "The server refused by its own rules. Repeating the call will not change that.",
    ),
    Rule(
        "anything else",
        lambda f, t: True,
        ASK_USER,
        False,
        "The failure could not be classified. A person should read the error before the call is repeated.",
    ),
)


def advise(failure: Failure, tool: Tool = Tool()) -> Advice:
    """The first rule of `RULES` that matches this failure of this tool."""
    category = failure.category if failure.category in CATEGORIES else "unknown"
    failure = Failure(
        category=category,
        may_have_acted=failure.may_have_acted,
        retry_after=failure.retry_after,
        held=failure.held,
        answered=failure.answered,
        relay_failed=failure.relay_failed,
    )
    for rule in RULES:
        if rule.when(failure, tool):
            return Advice(category=category, action=rule.action, retryable=rule.retryable, why=rule.why,
                          retry_after=rule.retry_after(failure))
    raise AssertionError("the last rule matches everything")  # pragma: no cover


def needs_retry_guard(*, kind: str, idempotent: bool) -> bool:
    """Whether a repeat of this tool after an unknown outcome must be held: it may act, and acting twice is
    not harmless (neither read-only nor idempotent)."""
    return kind != "read_only" and not idempotent


def tool_of(tool_def: Any, *, kind: str, retries_allowed: bool = False) -> Tool:
    """A tool's traits from its catalogue entry and the kind its declaration was read as."""
    annotations = tool_def.get("annotations") if isinstance(tool_def, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    return Tool(read_only=kind == "read_only", idempotent=annotations.get("idempotentHint") is True,
                reversible=kind == "compensate", retries_allowed=retries_allowed)
