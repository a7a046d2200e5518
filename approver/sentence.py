"""What signing a plan will do, in one sentence: "Signing will: put back deal D-881's stage to Proposal;
cancel 'Kickoff with Globex' on Dec 4: attendees get a cancellation notice. It will not touch: priya's amount
change. Cannot be undone: Emailed 'Welcome aboard, Globex' to buyer@globex.example (remedy: send a
correction email)."

The page's top, the sign button, the approvers' email and the plan's JSON all read this one function, and it
sorts each item with `execution.intent`, the function the executor decides with: what it says will be undone
is what the executor sends, what it says is left alone is what the executor skips. Pure: it reads items as
given, no database and no clock.
"""

from dataclasses import dataclass
from typing import Any

from journal.undo.recipe_text import recipe_title, record_name

from . import execution
from .wording import changed_by_whom

CONFLICT = "conflict"
KEEP_NEWER, OVERWRITE = "keep_newer", "overwrite"
# Checks after which the undo is sent all the same, but its server may refuse it.
_DOUBTFUL = {"error", "unavailable", "expired"}
SHOWN = 12  # phrases per part; the page lists them all below


@dataclass(frozen=True)
class Sentence:
    undo: tuple[str, ...] = ()  # what will be undone, in the order it will be
    keep: tuple[str, ...] = ()  # what it will not touch: undos left alone, newer changes kept
    cannot: tuple[str, ...] = ()  # what cannot be undone, each with its remedy
    choose: tuple[str, ...] = ()  # conflicts nobody has chosen for yet: signing needs a choice

    def text(self, lead: str = "Signing will") -> str:
        parts = [f"{lead}: {_listed(self.undo)}." if self.undo else f"{lead} undo nothing."]
        if self.keep:
            parts.append(f"It will not touch: {_listed(self.keep)}.")
        if self.cannot:
            parts.append(f"Cannot be undone: {_listed(self.cannot)}.")
        if self.choose:
            parts.append(f"Choose first, for each record changed since: {_listed(self.choose)}.")
        return " ".join(parts)

    def as_json(self, lead: str = "Signing will") -> dict[str, Any]:
        return {"text": self.text(lead), "undo": list(self.undo), "keep": list(self.keep),
                "cannot": list(self.cannot), "choose": list(self.choose)}


def lead(state: str, *, may_sign: bool = True) -> str:
    """How the sentence begins for a plan in `state`, read by someone who may sign it now, or not."""
    if state == "ready":
        return "Signing will" if may_sign else "Once approved, this plan will"
    if state in ("approved", "executing", "paused"):
        return "Approved, this plan will"
    return "This plan set out to"


def of_items(items: list[Any]) -> Sentence:
    """The sentence for a plan's items in position order (PlanItems with their steps)."""
    undo, keep, cannot, choose = [], [], [], []
    for item in items:
        intent = execution.intent(item.action, item.conflict_choice, getattr(item, "dialect", ""))
        if intent == execution.CANNOT:
            cannot.append(_cannot(item))
        elif intent == execution.LEAVE:
            keep.append(_left_alone(item))
        elif intent == execution.UNDO:
            detail = item.check_detail or {}
            if getattr(item, "dialect", "") == "database" and item.check_status == CONFLICT and \
                    item.conflict_choice:  # row by row: the rest go back, the conflicting rows as chosen
                undo.append((_lead(detail.get("wouldDo") or "") or _take_back(item)) + _from_capture(detail))
                rows = (detail.get("rows") or {}).get(CONFLICT, 0)
                (keep if item.conflict_choice == KEEP_NEWER else undo).append(
                    f"the {rows:,} row{'' if rows == 1 else 's'} changed since by someone else" +
                    (", overwritten as the approvers chose" if item.conflict_choice == OVERWRITE else ""))
                continue
            if item.check_status == CONFLICT and item.conflict_choice != OVERWRITE:
                choose.append(_to_choose(item, detail))
                continue
            undo.append(_undo(item, detail))
            if item.conflict_choice == OVERWRITE and getattr(item, "dialect", "") != "recipe":
                keep.extend(_kept_fields(item, detail))  # a server's field write keeps the other fields
    return Sentence(tuple(undo), tuple(keep), tuple(cannot), tuple(choose))


def _undo(item, detail: dict[str, Any]) -> str:
    recipe = recipe_title(item.step.earlier_state) if getattr(item, "dialect", "") == "recipe" else ""
    phrase = _lead(recipe or detail.get("wouldDo") or "") or _put_back(item) or _take_back(item)
    if detail.get("chained"):
        phrase += f", {detail['chained']}"
    phrase += _from_capture(detail)
    if item.check_status in _DOUBTFUL:
        phrase += f" (its check said: {_lead(detail.get('message') or 'it could not be checked')})"
    if item.conflict_choice == OVERWRITE:
        phrase += _over(item, detail)
    return phrase


def _from_capture(detail: dict[str, Any]) -> str:
    """A big statement's undo depends on the rows the database's capture keeps (the record keeps their
    digest)."""
    return " (its rows read from the database's capture, checked against the record's digest)" \
        if detail.get("inCapture") else ""


def _over(item, detail: dict[str, Any]) -> str:
    """What an overwrite does to the newer change: the fields both changed are overwritten; where the agent's
    fields and the newer ones are apart, the newer change is kept (`_kept_fields` names it)."""
    rows = _rows(detail)
    if not rows:
        return f", over {_whose(detail)} newer change, as the approvers chose"
    agent, since = changed_by_whom(rows)
    lost = [f for f in since if f in agent]
    if lost:
        return f", overwriting {_whose(detail)} change to the {' and '.join(lost)}, as the approvers chose"
    by = ((detail.get("current") or {}).get("changedBy")) or "someone"
    return f" ({by} changed other fields since: the approvers chose to undo anyway)"


def _put_back(item) -> str:
    """"put back deal D-881's stage to Proposal" from the changed fields' values its server gave."""
    fields = item.step.effect_fields if isinstance(item.step.effect_fields, dict) else {}
    before, after = fields.get("before") or {}, fields.get("after") or {}
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return ""
    changed = [name for name in after if name in before and after[name] != before[name]]
    if not changed:
        return ""
    whose = f"{name}'s " if (name := _record(item)) else ""
    return "put back " + " and ".join(f"{whose if n == 0 else ''}{field} to {_plain(before[field])}"
                                      for n, field in enumerate(changed))


def _take_back(item) -> str:
    step = item.step
    if step.effect_summary:
        return f"take back the agent's change “{_unstopped(step.effect_summary)}”"
    return f"call {item.tool or 'its undo'} on {step.server_name} to undo step {step.number} ({step.tool})"


def _left_alone(item) -> str:
    detail = item.check_detail or {}
    by = ((detail.get("current") or {}).get("changedBy")) or ""
    thing = _record(item) or f"step {item.step.number}'s {item.step.tool}"
    left = f"{thing} as {by} left it" if by else f"{thing} as it is now"
    agent = f" (the agent's change “{_unstopped(item.step.effect_summary)}” stays)" if \
        item.step.effect_summary else " (the agent's change stays)"
    return left + agent


def _kept_fields(item, detail: dict[str, Any]) -> list[str]:
    """An overwrite keeps the newer change to the fields the agent did not touch: "priya's amount change"."""
    agent, since = changed_by_whom(_rows(detail))
    kept = [f for f in since if f not in agent]
    return [f"{_whose(detail)} {' and '.join(kept)} change"] if kept else []


def _to_choose(item, detail: dict[str, Any]) -> str:
    by = ((detail.get("current") or {}).get("changedBy")) or "someone"
    thing = _record(item) or f"step {item.step.number}'s {item.step.tool}"
    return f"{thing} ({by} changed it since the agent)"


def _record(item) -> str:
    """The record an item's undo changes, in words: its server's resource, else what a recipe reads."""
    return record_name(item.step.effect_resource or getattr(item, "record", "") or "")


def _cannot(item) -> str:
    step = item.step
    what = _lead(step.effect_summary) if step.effect_summary else f"step {step.number}'s {step.tool} " \
        f"on {step.server_name}"
    return f"{what} (remedy: {_unstopped(item.remedy)})" if item.remedy else what


def _whose(detail: dict[str, Any]) -> str:
    by = ((detail.get("current") or {}).get("changedBy")) or ""
    return f"{by}'s" if by else "the"


def _rows(detail: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in ((detail.get("threeWay") or {}).get("fields") or []) if isinstance(r, dict)]


def _lead(words: str) -> str:
    """A server's sentence as part of ours: its first letter small (unless the word is a name such as
    "SKU"), no closing full stop."""
    words = _unstopped(words)
    if len(words) > 1 and words[0].isupper() and not words[1].isupper():
        return words[0].lower() + words[1:]
    return words


def _unstopped(words: str) -> str:
    return " ".join(str(words).split()).rstrip(". ")


def _plain(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text[:60] + "…" if len(text) > 60 else text


def _listed(phrases: tuple[str, ...]) -> str:
    shown = list(phrases[:SHOWN])
    if len(phrases) > SHOWN:
        shown.append(f"and {len(phrases) - SHOWN} more (listed below)")
    return "; ".join(shown)
