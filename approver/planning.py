"""Reversal plans, as pure functions: which steps a plan must take back, in which order, and how.

No ORM and no clock: `approver.services` reads the steps into `StepFacts`, passes `now` in, and writes
what comes out.

Dependencies (docs/design.md): a step depends on an earlier one when it used its result. Undoing a step
therefore means undoing every later step that depended on it, transitively. Three rules say which steps
depend on which:
- **declared**: the call itself listed the steps it depends on (`_meta["hatp/journal"]["dependsOn"]`);
  then that list (plus any inferred links) is the whole truth for it;
- **inferred**: a value in its arguments equals a value in an earlier result (the JSON pointers are kept);
- **all-earlier**: otherwise, to be safe, it depends on every earlier step.
Each item records the rule that pulled it in, and from which step.
"""

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from journal.record import idempotency
from journal.record.canonical import sha256_hex
from journal.undo.declarations import NO_VERSION_PROBLEM

# The dialect of a compensation decides how it is checked and run.
HATP = "hatp"
RECIPE = "recipe"
DATABASE = "database"
UI_NEEDS_HUMAN = (
    "Undone through the app's screens, by the server replaying the app's own way back: a person "
    "signs it, whatever the policies say."
)
RECIPE_NEEDS_HUMAN = (
    "An admin's recipe undoes this, for a server that says nothing about undoing it itself: a person signs "
    "it, whatever the policies say."
)
# An approver's answers to a conflict.
KEEP_NEWER, OVERWRITE = "keep_newer", "overwrite"


@dataclass(frozen=True)
class StepFacts:
    """What planning needs to know of one step."""

    id: int
    number: int
    server: str
    tool: str
    status: str  # pending | held | ok | error
    reversibility: str  # compensate | none | unknown | read_only
    declaration: dict[str, Any]
    compensation_arguments: dict[str, Any] | None
    undo_problems: tuple[str, ...]
    effect_summary: str
    effect_resource: str
    effect_version: str
    undo_by: datetime | None
    finished_at: datetime | None
    declared_deps: tuple[int, ...] | None = None  # None: the call declared nothing
    inferred_deps: dict[int, tuple[dict[str, str], ...]] = field(
        default_factory=dict
    )  # earlier number -> pointers
    already_undone: bool = False
    # The plan (its short id) whose undo of this step nobody knows the end of: it may have taken effect.
    undo_unknown: str = ""
    failure_class: str = ""  # "policy": an autonomy policy stopped it, so it was never forwarded
    arguments: dict[str, Any] = field(default_factory=dict)  # what the call sent
    server_tools: tuple[str, ...] = ()  # the tools its server lists now
    compensation_then: list[dict[str, Any]] | None = None  # a recipe's further calls, resolved
    task_id: str = ""  # the server made the call a task (the MCP tasks extension), still running if pending
    run_id: int = 0  # the run it is a step of
    run: str = ""  # that run's public id, set when a plan reaches across runs (undo since a moment)
    held_end: str = ""  # how a held attempt ended unsent (`journal.ports.HeldEnd`)
    held_call: str = ""  # the state of the request it was held on (`journal.ports.HeldState`)
    went_out_as: int | None = None  # the step that carried that call once approved


@dataclass(frozen=True)
class Pull:
    rule: str  # chosen | inferred | declared | all-earlier
    by: int | None = None  # the step (number) whose dependency pulled this one in
    pointers: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class ItemDraft:
    step: StepFacts
    position: int
    action: str  # compensate | cannot_undo | nothing_to_undo | already_undone
    pull: Pull
    tool: str = ""
    arguments: dict[str, Any] | None = None
    if_version: str = ""
    idempotency_key: str = ""
    dialect: str = ""
    via: str = ""
    side_effect: str = ""
    cost: dict[str, Any] | None = None
    undo_by: datetime | None = None
    needs_human: str = ""
    reason: str = ""
    remedy: str = ""
    then: list[dict[str, Any]] | None = None  # a recipe's further calls, made in order after the first


class PlanningError(ValueError):
    """The request cannot become a plan; the message says why, for the person who asked."""


def closure(steps: list[StepFacts], chosen: set[int]) -> dict[int, Pull]:
    """The chosen steps and every later step that depends on one of them, each with the rule that pulled it
    in. One pass in step order: a step can only depend on earlier ones."""
    known = {s.number for s in steps}
    missing = sorted(chosen - known)
    if missing:
        raise PlanningError(f"The run has no step {', '.join(map(str, missing))}.")
    pulled: dict[int, Pull] = {}
    first_in_plan: int | None = None
    for step in sorted(steps, key=lambda s: s.number):
        if step.number in chosen:
            pulled[step.number] = Pull("chosen")
        elif first_in_plan is not None:
            pull = _pull(step, pulled, first_in_plan)
            if pull is not None:
                pulled[step.number] = pull
        if step.number in pulled and first_in_plan is None:
            first_in_plan = step.number
    return pulled


def _pull(step: StepFacts, pulled: dict[int, Pull], first_in_plan: int) -> Pull | None:
    for number in sorted(step.inferred_deps):
        if number in pulled:
            return Pull("inferred", number, step.inferred_deps[number])
    if step.declared_deps is not None:
        for number in sorted(step.declared_deps):
            if number in pulled:
                return Pull("declared", number)
        return None
    return Pull("all-earlier", first_in_plan) if first_in_plan < step.number else None


def inclusion_words(rule: str, by: int | None, pointers: Any) -> str:
    """Why a step is in a plan, in words: chosen, or which step's dependency brought it in, and how."""
    if rule == "chosen" or by is None:
        return "chosen"
    if rule == "inferred":
        links = "; ".join(f"its {p.get('to')} is step {by}'s {p.get('from')}" for p in pointers or []
                          if isinstance(p, dict))
        return f"added: it used a value from step {by}'s result" + (f" ({links})" if links else "")
    if rule == "declared":
        return f"added: the agent declared that it depends on step {by}"
    return (f"added: it came after step {by}, and a step that declares nothing is taken to depend on every "
            "earlier one (the safe rule)")


def reverse_completion_order(steps: list[StepFacts]) -> list[StepFacts]:
    """Last finished is undone first. A step still in flight sorts as if it finished last (it is the most
    recent thing the agent did); ties go by step number, later first."""
    far_future = datetime.max.replace(tzinfo=None)

    def key(step: StepFacts):
        finished = step.finished_at.replace(tzinfo=None) if step.finished_at else far_future
        return finished, step.number if not step.run else step.id  # across runs: the order they were made

    return sorted(steps, key=key, reverse=True)


def idempotency_key(plan_id: str, step_number: int, secret: bytes, run: str = "") -> str:
    """Stable for the plan's life, so a retried compensation is the same request to the server, and
    unguessable without `secret` (`journal.record.idempotency`): an agent told the plan's id cannot send it
    first. A plan across runs names the run too (two runs both have a step 1)."""
    return idempotency.recorder_key(secret, "undo", plan_id, *((run,) if run else ()), step_number)


def draft_items(
    steps: list[StepFacts], pulled: dict[int, Pull], *, plan_id: str, key_secret: bytes, now: datetime
) -> list[ItemDraft]:
    in_plan = [s for s in steps if s.number in pulled]
    return _drafts(in_plan, lambda step: pulled[step.number], plan_id=plan_id, key_secret=key_secret, now=now)


def draft_items_since(steps: list[StepFacts], *, plan_id: str, key_secret: bytes,
                      now: datetime) -> list[ItemDraft]:
    """Everything an agent did since a moment, across its runs (`steps`: each call it made since then). Every
    one is chosen: in each run they are that run's steps from the first one since the moment onwards, so no
    dependency has a later step to add. They are undone most recent first, whichever run they are in."""
    return _drafts(steps, lambda step: Pull("chosen"), plan_id=plan_id, key_secret=key_secret, now=now)


def draft_items_pulled(steps: list[StepFacts], pulls: dict[int, Pull], *, plan_id: str, key_secret: bytes,
                       now: datetime) -> list[ItemDraft]:
    """`draft_items` for steps that may be in several runs: `pulls` are by step id (each run's `closure`)."""
    in_plan = [s for s in steps if s.id in pulls]
    return _drafts(in_plan, lambda step: pulls[step.id], plan_id=plan_id, key_secret=key_secret, now=now)


def _drafts(in_plan: list[StepFacts], pull_of, *, plan_id: str, key_secret: bytes,
            now: datetime) -> list[ItemDraft]:
    covered = frozenset((step.run_id, step.number) for step in in_plan)
    return [
        _item(step, position, pull_of(step), key=idempotency_key(plan_id, step.number, key_secret, step.run),
              now=now, covered=covered)
        for position, step in enumerate(reverse_completion_order(in_plan), start=1)
    ]


def _item(step: StepFacts, position: int, pull: Pull, *, key: str, now: datetime,
          covered: frozenset = frozenset()) -> ItemDraft:
    base = {"step": step, "position": position, "pull": pull}
    settled = _without_compensation(step, covered)
    if settled is not None:
        action, reason, remedy = settled
        return ItemDraft(**base, action=action, reason=reason, remedy=remedy)
    return _compensating(step, base, key=key, now=now)


def _without_compensation(step: StepFacts, covered: frozenset = frozenset()) -> tuple[str, str, str] | None:
    """(action, reason, remedy) for a step whose undo needs no compensation of its own: undone already,
    nothing to undo, or one that cannot be undone; None for a step its server says it can compensate."""
    declaration = step.declaration or {}
    by_hand = what_is_known(step)
    if step.already_undone:
        return "already_undone", "An earlier plan already undid this step.", ""
    if step.undo_unknown:  # sending its undo again might undo it twice
        return ("cannot_undo", f"Plan {step.undo_unknown} sent this step's undo and nobody knows whether it "
                "took effect: it cannot be undone again until that is settled.",
                f"On plan {step.undo_unknown}'s report, check again or say how it ended; then ask for a "
                "plan again.")
    if step.status == "pending" and step.task_id:
        return ("cannot_undo", f"{step.server} is still running this call as a task ({step.task_id}): "
                "what it did is not known until the task ends. Ask for a plan again once it has.", by_hand)
    if step.status == "pending":
        return "cannot_undo", "The call's outcome was never recorded, so what it did is not known.", by_hand
    if step.status == "held":
        return "nothing_to_undo", _HELD_NOW.get(step.held_call, HELD_NOT_MADE), ""
    if step.held_end and step.failure_class == "policy":
        return "nothing_to_undo", _held_unsent(step, covered), ""
    if step.failure_class == "policy":
        return "nothing_to_undo", "An autonomy policy stopped it: it was never sent to the tool server.", ""
    if step.reversibility == "read_only":
        return "nothing_to_undo", "A read: it changed nothing.", ""
    if failed_unchanged(step):
        return "nothing_to_undo", "The call failed and changed nothing.", ""
    remedy = declaration.get("remedy") or ""
    if step.reversibility == "none":
        return (
            "cannot_undo",
            declaration.get("reason") or f"{step.server} says this cannot be undone.",
            remedy,
        )
    if step.reversibility != "compensate":
        reason = "; ".join(step.undo_problems) or f"{step.server} says nothing about undoing {step.tool}."
        return "cannot_undo", _sentence(reason), remedy or by_hand
    return None


def failed_unchanged(step: StepFacts) -> bool:
    """A call that failed, and so changed nothing: but a database call may have changed rows before it
    failed (its capture says which), and then it has something to undo."""
    compensation = (step.declaration or {}).get("compensation") or {}
    changed_rows = compensation.get("dialect") == DATABASE and bool(step.compensation_arguments)
    return step.status == "error" and step.reversibility != "unknown" and not changed_rows


HELD_NOT_MADE = "Held for approval and not made: deny it on its held-call page so it never is."
_HELD_NOW = {"approved": "Held for approval, approved, and not sent yet: this plan is drafted again once it "
                         "is."}


def _held_unsent(step: StepFacts, covered: frozenset) -> str:
    """What became of a held call whose own attempt was never sent (the agent was told, or stopped
    waiting); `covered`: the (run, number) of each step in the plan."""
    if step.went_out_as is not None and step.went_out_as != step.number:
        where = ("undone as its own item" if (step.run_id, step.went_out_as) in covered
                 else f"not in this plan: ask for a plan from step {step.went_out_as} to undo it")
        return (f"Held for approval and never sent itself: once approved, the call went out with the agent's "
                f"next identical call, step {step.went_out_as}, {where}.")
    if step.held_call == "approved":
        return ("Held for approval and never sent itself; approved since, it goes out with the agent's next "
                "identical call (this plan is drafted again when it does).")
    return "Held for approval and never sent."


# Verbs whose tools may take another's change back (create_entities → delete_entities), for the remedy of a
# step nobody can undo for you: named as what the server offers, never run.
_INVERSE_VERBS = {
    "create": ("delete", "remove"), "add": ("remove", "delete"), "write": ("delete",), "insert": ("delete",),
    "set": ("delete", "del", "unset"), "enable": ("disable",), "open": ("close",), "start": ("stop",),
    "lock": ("unlock",), "subscribe": ("unsubscribe",), "assign": ("unassign",), "attach": ("detach",),
    "delete": ("create", "restore", "undelete"), "remove": ("add", "restore"),
}
_UNDO_PREFIXES = ("undo", "revert", "restore", "rollback", "undelete")


def inverse_tools(tool: str, tools: tuple[str, ...]) -> list[str]:
    """The tools of the same server whose names say they may take `tool`'s change back."""
    verb, _, rest = tool.partition("_")
    named = {f"{inverse}_{rest}" if rest else inverse for inverse in _INVERSE_VERBS.get(verb.lower(), ())}
    found = [t for t in tools if t in named or (t != tool and t.lower().startswith(_UNDO_PREFIXES))]
    return sorted(set(found))[:5]


def what_is_known(step: StepFacts) -> str:
    """The remedy for a step nobody can undo for you: what is known of it, not only "check by hand"."""
    sent = ", ".join(f"{name}={_short(value)}" for name, value in sorted(step.arguments.items())[:4])
    words = f"Check {step.server} by hand for what {step.tool} did"
    words += f" (it was sent {sent})" if sent else ""
    if inverses := inverse_tools(step.tool, step.server_tools):
        words += f"; {step.server} offers {', '.join(inverses)}, which may take it back"
    return words + "."


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text[:60] + "…") if len(text) > 60 else repr(text)


def _compensating(step: StepFacts, base: dict[str, Any], *, key: str, now: datetime) -> ItemDraft:
    """A step its server says it can compensate: the compensation, or why it cannot run automatically."""
    declaration = step.declaration or {}
    # Without a version the undo can still run, but a later change could not be detected: it is listed
    # with the others and flagged for the approver, never run on its own (docs/design.md).
    problems = [p for p in step.undo_problems if p != NO_VERSION_PROBLEM]
    needs_human = "" if step.effect_version else _sentence(NO_VERSION_PROBLEM.capitalize())
    if (
        declaration.get("via") == "ui"
    ):  # the HATP draft: an undo through the app's screens always has a signer
        needs_human = UI_NEEDS_HUMAN
    elif declaration.get("needs_human"):  # an admin's recipe: a person signs unless the admin said otherwise
        needs_human = RECIPE_NEEDS_HUMAN
    if step.undo_by is not None and step.undo_by <= now:
        problems.append(f"the undo window closed at {step.undo_by.isoformat()}")
    compensation = declaration.get("compensation") or {}
    if not compensation.get("tool") or step.compensation_arguments is None:
        problems.append("no compensation could be prepared")
    if compensation.get("then") and step.compensation_then is None:
        problems.append("its recipe's further calls could not be prepared")
    common = {
        "via": declaration.get("via") or "api",
        "side_effect": declaration.get("side_effect") or "",
        "cost": declaration.get("cost"),
        "undo_by": step.undo_by,
        "remedy": declaration.get("remedy") or "",
    }
    if problems:
        return ItemDraft(
            **base,
            action="cannot_undo",
            **common,
            reason="Not automatically undoable: " + _sentence("; ".join(dict.fromkeys(problems))),
        )
    return ItemDraft(
        **base,
        action="compensate",
        **common,
        tool=compensation["tool"],
        dialect=compensation.get("dialect", ""),
        arguments=step.compensation_arguments,
        then=step.compensation_then or None,
        if_version=step.effect_version,
        idempotency_key=key,
        needs_human=needs_human,
    )


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith(".") else text + "."


def plan_content(*, plan: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """What an approver signs: the plan's header and its items, check results and conflict choices
    included. `items` are `item_content` dicts in position order."""
    return {**plan, "items": items}


def item_content(
    *,
    position: int,
    step: int,
    server: str,
    tool: str,
    action: str,
    rule: str,
    pulled_in_by: int | None,
    compensation: dict[str, Any] | None,
    needs_human: str,
    via: str,
    side_effect: str,
    cost: Any,
    undo_by: str | None,
    reason: str,
    remedy: str,
    effect: dict[str, str],
    check: dict[str, Any] | None,
    conflict_choice: str = "",
    override_reason: str = "",
    run: str = "",
) -> dict[str, Any]:
    """One item as signed. On a conflict the approver's choice is part of it: "overwrite" makes the
    compensation carry the version they saw as `ifVersion` (so a further change still stops it), and is an
    override with its written reason (`overrideReason`, signed by every approver alike); "keep_newer" leaves
    the newer change alone and the item is skipped. `run`: the step's run, named in a plan across runs."""
    if (
        compensation is not None
        and conflict_choice == OVERWRITE
        and check
        and check.get("status") == "conflict"
    ):
        seen = (check.get("current") or {}).get("version") or None
        compensation = {**compensation, "ifVersion": seen}
    return {
        "position": position, **({"run": run} if run else {}), "step": step, "server": server, "tool": tool,
        "action": action,
        "pulledInBy": {"rule": rule, "step": pulled_in_by}, "compensation": compensation,
        "needsHuman": needs_human or None, "via": via or None,
        "sideEffect": side_effect or None, "cost": cost, "undoBy": undo_by, "reason": reason or None,
        "remedy": remedy or None, "effect": effect, "check": check, "conflictChoice": conflict_choice or None,
        **({"overrideReason": override_reason} if conflict_choice == OVERWRITE and override_reason else {}),
    }


def record_key(tool: str, arguments: Any) -> str:
    """A record named by the call that reads it (an admin's recipe reads the record before the call): the
    tool and its arguments as canonical JSON, shortened with their digest when long."""
    text = f"{tool} {json.dumps(arguments, sort_keys=True, separators=(',', ':'), ensure_ascii=False)}"
    return text if len(text) <= 500 else f"{text[:420]} … {sha256_hex(arguments)[:16]}"


def digest(content: dict[str, Any]) -> str:
    return sha256_hex(content)


SHORT_DIGEST = 12  # hex characters: what a person compares at a glance, in three groups of four


def short_digest(value: str) -> str:
    """A digest's short form, as shown by the sign button and in messages: "9c3f 21aa 07be"."""
    head = (value or "")[:SHORT_DIGEST]
    return " ".join(head[i:i + 4] for i in range(0, len(head), 4))


def seen_digest(raw: Any) -> str:
    """The digest a message's link carried (its short form without spaces, or the whole), or "" if it is not
    one: only lowercase hex, at least the short form's length, at most a whole SHA-256."""
    text = raw if isinstance(raw, str) else ""
    ok = SHORT_DIGEST <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)
    return text if ok else ""
