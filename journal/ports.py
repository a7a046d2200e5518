"""The interfaces the Recorder asks through, so the journal never needs to know who answers them.

- A **policy gate** decides each agent call before it is forwarded (allow, ask, deny), holds the calls it
  asks about until someone decides, and lets an approved call through once.
- A **source of signed decisions** adds the approvals of a run's plans and held calls to its exported bundle.
- A **run story** tells the journal's pages what became of a run's steps: undone by which plan, held and
  approved by whom.

The approval side plugs its own in when the app starts (`approver.apps.ApproverConfig.ready`). Until then,
and whenever the journal runs on its own, the defaults allow every call, hold none and add no decisions, so
the journal works and is tested without the approval side.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

# The longest a gate may hold a call (a policy's `askTimeout`).
MAX_HOLD_SECONDS = 3600
# How often the process holding a call marks it as still held, and after how long without a mark nobody holds
# it any more (its Recorder stopped): the reconciler then settles the step as never sent.
HOLD_BEAT_SECONDS = 10
HOLD_LOST_SECONDS = 45
# How long a held call waits when its decision names no time of its own.
DEFAULT_HOLD_SECONDS = 60


class HeldState:
    """Where a held call's request stands."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    USED = "used"


class HeldEnd:
    """How a held attempt that was never sent ended (`Step.held_end`): what its record and every page say."""

    TOLD = "told"
    HUNG_UP = "hung_up"
    LOST = "lost"
    DENIED = "denied"
    LAPSED = "lapsed"
    CHOICES = [(TOLD, "The agent was told it awaits approval"), (HUNG_UP, "The agent stopped waiting"),
               (LOST, "The Recorder holding it stopped"), (DENIED, "Denied"),
               (LAPSED, "The approval expired or was used")]


@dataclass(frozen=True)
class HeldCall:
    """The request a held call waits on: its id for polling, and what the agent is told."""

    id: int
    public_id: str
    url: str


class HoldRefused(Exception):
    """The call is not held after all (its agent has as many calls waiting as it may): `message` says why,
    and nothing is sent."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class HeldCallState:
    state: str
    decided_by: str
    decision_reason: str
    expires_at: datetime


class PolicyGate(Protocol):
    def decide(self, *, agent_name: str, server_name: str, tool: str, declaration: Any,
               retry_of: dict[str, Any] | None = None, team: int = 0) -> dict[str, Any] | None:
        """The decision as the run record keeps it (`{"decision": "allow"|"ask"|"deny", ...}`; an `ask`
        carries `hold`: who approves, how many, `askTimeout`), or None when nothing governs calls. `team` is
        the agent's team's id (a policy may cover one team's agents).
        `retry_of` is an earlier attempt of the very same call whose outcome is unknown (the retry guard:
        such a repeat is held unless a policy lets it through)."""

    def hold(
        self,
        *,
        agent: Any,
        server: Any,
        tool: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        decision: dict[str, Any],
        run_id: int,
        step_id: int,
        now: datetime,
    ) -> HeldCall:
        """The request this held call waits on (an identical call, same arguments and `_meta`, already waiting
        shares it). HoldRefused when it cannot be held (its agent has as many waiting as it may)."""

    def state(self, held_id: int) -> HeldCallState | None:
        """Where the request stands now: one cheap read, polled while the agent waits."""

    def held_call(self, public_id: str) -> HeldCall | None:
        """The request a held call waits on, by its public id (None if there is none)."""

    def claim(self, *, held_id: int, opened: Any, meta: dict[str, Any] | None) -> bool:
        """Use an approval for this one call and release its held step (`opened`) to be sent with `meta`, in
        one transaction; False, with nothing released, if it is not (or no longer) approved or the step is
        no longer held (the record says it was never sent, so it never is). Each approval is checked again
        first (passkey not revoked, approver still active and in the role)."""

    def failed(self, *, run_id: int, step_id: int, mode: str) -> dict[str, Any]:
        """A call failed under a policy that stops the run on failure (`mode`: propose or unwind): open the
        plan that undoes the run's task, halt the run, and say what was done (`{"plan", "url"}` or
        `{"refused"}`)."""

    def unwind(self, *, plan: int) -> dict[str, Any]:
        """Check and run that plan now if no human is needed (else it waits for approvers): what was reversed,
        what could not be and why. Blocking; the Recorder runs it in a thread, up to its time limit."""

    def halting(self, *, plan: str) -> str | None:
        """Why calls in a run halted by this plan are refused, or None once the plan has ended."""


class AllowEverything:
    """The gate when no approval side is plugged in: every call is forwarded and nothing is ever held."""

    def decide(self, *, agent_name: str, server_name: str, tool: str, declaration: Any,
               retry_of: dict[str, Any] | None = None, team: int = 0) -> None:
        return None

    def hold(self, **kwargs) -> HeldCall:
        raise RuntimeError("No policy gate is installed, so no call can be held.")

    def state(self, held_id: int) -> None:
        return None

    def claim(self, *, held_id: int, opened: Any, meta: dict[str, Any] | None) -> bool:
        return False

    def failed(self, *, run_id: int, step_id: int, mode: str) -> dict[str, Any]:
        return {}

    def unwind(self, *, plan: int) -> dict[str, Any]:
        return {}

    def halting(self, *, plan: str) -> str | None:
        return None


def no_decisions(run: Any) -> list[dict[str, Any]]:
    return []


class RunStory(Protocol):
    """What became of runs and their steps on the approval side, for the journal's pages."""

    def steps(self, steps: list[Any]) -> dict[int, dict[str, Any]]:
        """By step id, where it applies: `undone` (`{"id", "short", "state", "url", "at", "by"}`: the plan
        that undid it, when, and who let it run), `left` (the last finished plan that did not, with its
        `outcome` in words), `inPlan` (the open plan holding it) and `held` (`{"url",
        "state", "trail": [{"what", "at"}]}`: its held call, held → approved by … → sent)."""

    def run(self, run: Any) -> dict[str, Any]:
        """`compensates`: the plan whose undo calls this run journals, if it is one."""

    def runs(self, runs: list[Any]) -> dict[int, dict[str, Any]]:
        """By run id: `openPlan` (an open plan covering it) and `compensates`, where they apply."""


class NoStory:
    """Without the approval side nothing happened to a run but its own calls."""

    def steps(self, steps: list[Any]) -> dict[int, dict[str, Any]]:
        return {}

    def run(self, run: Any) -> dict[str, Any]:
        return {}

    def runs(self, runs: list[Any]) -> dict[int, dict[str, Any]]:
        return {}


_installed: dict[str, Any] = {"gate": AllowEverything(), "signed_decisions": no_decisions, "story": NoStory()}


def install(*, gate: PolicyGate | None = None,
            signed_decisions: Callable[[Any], list[dict[str, Any]]] | None = None,
            story: RunStory | None = None) -> None:
    """Plug in the approval side's answers (once, when the app starts)."""
    if gate is not None:
        _installed["gate"] = gate
    if signed_decisions is not None:
        _installed["signed_decisions"] = signed_decisions
    if story is not None:
        _installed["story"] = story


def gate() -> PolicyGate:
    return _installed["gate"]


def story() -> RunStory:
    return _installed["story"]


def signed_decisions(run: Any) -> list[dict[str, Any]]:
    """Every signed decision on the run's plans and held calls, as the bundle carries them."""
    return _installed["signed_decisions"](run)
