"""Executing an approved plan, as pure decisions: what each item's outcome is, whether a failure may be
retried, and which items a failure stops.

The Celery executor (which claims items and calls servers) asks these functions; they read no database and
no clock. Outcomes are docs/design.md's: compensated, compensation_failed, conflict, skipped, irreversible,
no_compensation, outcome_unknown.
"""

from dataclasses import dataclass, field
from typing import Any

from . import answers

COMPENSATED = "compensated"
COMPENSATION_FAILED = "compensation_failed"
CONFLICT = "conflict"
SKIPPED = "skipped"
IRREVERSIBLE = "irreversible"
NO_COMPENSATION = "no_compensation"
OUTCOME_UNKNOWN = "outcome_unknown"
ALREADY_UNDONE = "already_undone"  # an earlier plan undid the step: nothing left to do, and nothing skipped
# How the plan page and the report name each outcome.
OUTCOME_WORDS = {
    COMPENSATED: "Undone",
    COMPENSATION_FAILED: "Undo failed",
    CONFLICT: "Left alone: changed since",
    SKIPPED: "Skipped",
    IRREVERSIBLE: "Cannot be undone",
    NO_COMPENSATION: "Nothing to undo",
    OUTCOME_UNKNOWN: "Outcome unknown",
    ALREADY_UNDONE: "Already undone",
}
# Outcomes that leave nothing to undo: the plan is judged by the rest.
NOTHING_LEFT = frozenset({NO_COMPENSATION, IRREVERSIBLE, ALREADY_UNDONE})

# Outcomes after which the items this one depends on must not be undone (docs/design.md: "if an item fails,
# nothing that it still depends on is undone"). A conflict leaves a newer change in place, so whatever it
# was built on stays too; an unknown outcome is treated as a failure until a human says otherwise.
STOPS_DEPENDENCIES = frozenset({COMPENSATION_FAILED, CONFLICT, OUTCOME_UNKNOWN})
# Outcomes that leave something for a human: the report's and the result email's to-do list.
NEEDS_A_HUMAN = frozenset({IRREVERSIBLE, OUTCOME_UNKNOWN, CONFLICT, COMPENSATION_FAILED})

MAX_ATTEMPTS = 4

# What signing means for an item (`intent`): its undo is sent, left alone as the approvers chose, or there is
# nothing to send (it cannot be undone, or it needs nothing).
UNDO, LEAVE, CANNOT, NOTHING = "undo", "leave", "cannot", "nothing"


def intent(action: str, choice: str, dialect: str = "") -> str:
    """What the executor does with an item of this action under this conflict choice: the plan's sentence
    (`approver.sentence`) says what it says from this same answer. A database undo's conflict is row by row:
    keeping the newer changes leaves those rows alone and puts back the rest."""
    if action == "cannot_undo":
        return CANNOT
    if action != "compensate":
        return NOTHING
    return LEAVE if choice == "keep_newer" and dialect != "database" else UNDO


@dataclass(frozen=True)
class Verdict:
    outcome: str
    detail: dict[str, Any] = field(default_factory=dict)
    retry: bool = False  # only ever True when repeating the call is safe


def without_compensation(action: str, reason: str) -> Verdict:
    """The outcome of an item that has no compensation to run."""
    outcome = {"cannot_undo": IRREVERSIBLE, "already_undone": ALREADY_UNDONE}.get(action, NO_COMPENSATION)
    return Verdict(outcome, {"message": reason})


def read_answer(result: dict[str, Any]) -> Verdict:
    """A compensation's tool result. HATP's UNDO_* codes are read as docs/design.md defines them; any other
    `isError` answer is a failed compensation in the server's own words."""
    content, message = answers.structured(result), answers.first_text(result)
    if result.get("isError") is not True:
        return Verdict(COMPENSATED, {"summary": answers.bounded(content.get("summary")) or message,
                                     "version": answers.bounded(content.get("version"))})
    code = content.get("code")
    if code == "UNDO_CONFLICT":
        return Verdict(CONFLICT, {"message": message, "current": answers.conflict_current(content)})
    if code == "UNDO_EXPIRED":
        return Verdict(
            COMPENSATION_FAILED, {"message": message or "The undo window has closed.", "code": code}
        )
    return Verdict(COMPENSATION_FAILED, {"message": message or "The server refused the compensation.",
                                         "code": answers.bounded(code) or None})


def read_postcondition(verdict: Verdict, check: dict[str, Any]) -> Verdict:
    """A compensation replayed through an app's screens (`via: "ui"`) counts only once `hatp_check` on the
    same
    token says the undo has happened: the record shows its earlier state again. Anything else is a failure,
    in the server's words, never `compensated`."""
    if verdict.outcome != COMPENSATED:
        return verdict
    if answers.says_undone(check):
        return Verdict(
            COMPENSATED, {**verdict.detail, "postcondition": "The app shows the earlier state again."}
        )
    said = answers.first_text(check)
    return Verdict(COMPENSATION_FAILED, {**verdict.detail, "postcondition": False, "message": answers.bounded(
        "The app does not show the earlier state" + (f": {said}" if said else "."))})


def read_failure(*, failure_class: str, message: str, transient: bool, may_have_acted: bool,
                 repeat_is_safe: bool, attempt: int) -> Verdict:
    """A compensation call that produced no tool result.

    A failure after which the server may have acted is never repeated blindly: unless the server honours
    the idempotency key (so a repeat returns the first outcome), it is `outcome_unknown` for a human, and
    so is the last such failure when no attempt remains. A transient failure is retried with backoff while
    attempts remain and a repeat is safe."""
    detail = {"failureClass": failure_class, "message": answers.bounded(message)}
    if transient and (repeat_is_safe or not may_have_acted) and attempt < MAX_ATTEMPTS:
        return Verdict(COMPENSATION_FAILED, {**detail, "mayHaveActed": may_have_acted}, retry=True)
    if may_have_acted:  # not safe to repeat, or out of attempts: nobody knows whether it took effect
        return Verdict(OUTCOME_UNKNOWN, {**detail, "message": answers.bounded(
            f"{message} The server may have acted; check it before trying again.")})
    return Verdict(COMPENSATION_FAILED, detail)


def backoff(attempt: int) -> float:
    """Seconds before retry `attempt` (1-based): 1, 4, 16."""
    return float(4 ** (attempt - 1))


def depends_on(
    step: int, *, earlier: list[int], declared: tuple[int, ...] | None, inferred: set[int]
) -> set[int]:
    """The earlier steps `step` depends on, by the planning rules: its declaration plus inferred links when
    it declared, else every earlier step (the safe rule)."""
    if declared is None:
        return {n for n in earlier if n < step}
    return {n for n in (*declared, *inferred) if n < step}


def steps_by_run(facts) -> dict[int, tuple[list[int], dict[int, int]]]:
    """Each run's step numbers in order, and the step (id) of each number (`facts`: `StepFacts`), for
    `dependencies`: a step depends only on steps of its own run."""
    runs: dict[int, tuple[list[int], dict[int, int]]] = {}
    for fact in sorted(facts, key=lambda f: (f.run_id, f.number)):
        numbers, ids = runs.setdefault(fact.run_id, ([], {}))
        numbers.append(fact.number)
        ids[fact.number] = fact.id
    return runs


def dependencies(facts: dict, step_id: int, runs: dict) -> set[int]:
    """The steps (ids) of its own run that the step `step_id` depends on (`facts`: id -> `StepFacts`, `runs`
    from `steps_by_run`)."""
    step = facts[step_id]
    numbers, ids = runs[step.run_id]
    return {ids[n] for n in depends_on(step.number, earlier=numbers, declared=step.declared_deps,
                                       inferred=set(step.inferred_deps)) if n in ids}


def stopped_by(step: int, failed: dict[int, set[int]]) -> int | None:
    """The failed step (if any, by id) whose dependencies include `step` (its id): undoing `step` would pull
    the ground from under a change that is staying. `failed` maps each stopping step to what it depends on."""
    for failed_step in sorted(failed, reverse=True):
        if step in failed[failed_step]:
            return failed_step
    return None


def summary_line(outcomes: list[str]) -> str:
    """"Reversed 2 of 2 actions; 1 cannot be undone": the actions are the undos the plan set out to make,
    the same count as its title ("Undo 2 actions") and its progress; what cannot be undone, and what an
    earlier plan undid already, are named after them."""
    actions = [o for o in outcomes if o not in (NO_COMPENSATION, ALREADY_UNDONE, IRREVERSIBLE)]
    reversed_ = sum(o == COMPENSATED for o in actions)
    parts = [f"Reversed {reversed_} of {len(actions)} action{'s' if len(actions) != 1 else ''}" if actions
             else "Nothing left to reverse"]
    for outcome, words in ((CONFLICT, "left alone: changed since"), (COMPENSATION_FAILED, "failed"),
                           (OUTCOME_UNKNOWN, "need a human to check"), (SKIPPED, "skipped"),
                           (IRREVERSIBLE, "cannot be undone")):
        count = sum(o == outcome for o in (outcomes if outcome == IRREVERSIBLE else actions))
        if count:
            parts.append(f"{count} {words}")
    already = sum(o == ALREADY_UNDONE for o in outcomes)
    if already:
        parts.append(f"{already} already undone by an earlier plan")
    return "; ".join(parts)


def finished_state(outcomes: list[str], *, stopped: bool) -> str:
    """A finished plan's state: `completed` when everything it could still undo was undone (items that
    cannot be undone, need nothing, or an earlier plan undid, do not count against it), `partially_completed`
    when some of it was, else `failed`."""
    undoable = [o for o in outcomes if o not in NOTHING_LEFT]
    if not stopped and all(o == COMPENSATED for o in undoable):
        return "completed"
    return "partially_completed" if COMPENSATED in undoable else "failed"


def recipe_before_undo(*, now: str, agent_left: str, before: str, overwrite: str = "") -> Verdict | None:
    """A recipe undo, read just before it runs (its server has no conditional write): None to go on when the
    record is as the agent left it (or as the version an approver chose to overwrite); else the outcome
    without a call: undone already, or a conflict (someone changed it since the check)."""
    if now in (agent_left, overwrite or agent_left):
        return None
    if now == before:
        return Verdict(ALREADY_UNDONE, {"message": "It already reads as it did before the agent's call."})
    return Verdict(CONFLICT, {"message": "Changed since the check: left alone.", "current": {"version": now}})


def recipe_after_undo(verdict: Verdict, *, now: str, before: str) -> Verdict:
    """A recipe undo counts only once the record reads again as it did before the agent's call."""
    if verdict.outcome != COMPENSATED:
        return verdict
    if now == before:
        return Verdict(COMPENSATED, {**verdict.detail,
                                     "postcondition": "It reads as it did before the call."})
    return Verdict(COMPENSATION_FAILED, {**verdict.detail, "postcondition": False, "message": (
        "The undo ran, but the record does not read as it did before the agent's call.")})


def recipe_after_override(verdict: Verdict, *, now: str, before: str, taken_back: bool, kept: bool
                          ) -> Verdict:
    """A recipe undo the approvers chose to run over a newer change counts once it did what they signed:
    the record reads as before the agent's call (the newer change overwritten: a file written back whole),
    or the agent's own change is taken back and the newer change kept (an observation deleted, a colleague's
    beside it left) (`changes.taken_back_and_kept`)."""
    if verdict.outcome != COMPENSATED:
        return verdict
    if now == before:
        return Verdict(COMPENSATED, {**verdict.detail, "postcondition": (
            "It reads as it did before the agent's call: the newer change is overwritten, as the approvers "
            "signed.")})
    if taken_back and kept:
        return Verdict(COMPENSATED, {**verdict.detail, "postcondition": (
            "The agent's change is taken back, and the newer change is kept: the undo takes back only what "
            "the agent did.")})
    return Verdict(COMPENSATION_FAILED, {**verdict.detail, "postcondition": False, "message": (
        "The undo ran, but the record reads neither as before the agent's call nor as the approvers signed "
        f"(the agent's change {'taken back' if taken_back else 'still there'}, the newer change "
        f"{'kept' if kept else 'changed'}).")})


def partial_undo(verdict: Verdict, *, calls: list[str], failed: int) -> Verdict:
    """A recipe undo of several calls whose call number `failed` did not do its part: the calls before it
    ran, so the undo is partial, and it is never tried again by itself (that would repeat them)."""
    ran = ", ".join(calls[:failed - 1])
    return Verdict(COMPENSATION_FAILED, {**verdict.detail, "message": (
        f"The undo is partial: {ran} ran, then {calls[failed - 1]} (call {failed} of {len(calls)}) did not: "
        f"{verdict.detail.get('message') or verdict.outcome}. Finish it by hand."), "partial": True},
        retry=False)
