"""How an undo and the answers to a conflict read: always as the change they make to the record, never as the
agent's own change. Pure functions over what a step and a check kept."""

import json
from typing import Any


def undo_words(summary: str, fields: Any) -> str:
    """An undo as the change it makes, never as the agent's own: "Put back stage: Won → Proposal (the
    agent's change was “Deal D-881 stage: Proposal → Won”)" from the changed fields' values its server gave
    (`Step.effect_fields`), else "Take back the agent's change “…”"; "" with nothing to say."""
    before = (fields or {}).get("before") if isinstance(fields, dict) else None
    after = (fields or {}).get("after") if isinstance(fields, dict) else None
    changed = [name for name in (after or {}) if name in (before or {}) and after[name] != before[name]]
    if changed:
        back = "; ".join(f"{name}: {_plain(after[name])} → {_plain(before[name])}" for name in changed)
        return f"Put back {back}" + (f" (the agent's change was “{summary}”)" if summary else "")
    return f"Take back the agent's change “{summary}”" if summary else ""


def choice_words(rows: list[Any], by: str, *, recipe: str = "") -> dict[str, str]:
    """What each answer to a conflict does to the record, from its three-way rows (`{"field", "before",
    "left", "now"}`) and who changed it since: `keep` ("Leave it as priya left it: skip this undo") and
    `overwrite` ("Undo the stage anyway: priya's amount change is kept"). A recipe's undo (`recipe`: what it
    does) is a call of the server's, not a field's write: what it keeps is not promised field by field."""
    whose = f"{by}'s" if by else "the newer"
    keep = f"Leave it as {by} left it: skip this undo" if by else "Leave it as it is now: skip this undo"
    agent, since = changed_by_whom([r for r in rows if isinstance(r, dict)])
    if recipe:
        return {"keep": keep, "overwrite": f"Undo it anyway, over {whose} change: {recipe}"}
    if not agent:
        return {"keep": keep, "overwrite": f"Undo it anyway, over {whose} change"}
    overwrite = f"Undo the {' and '.join(agent)} anyway"
    lost, kept = [f for f in since if f in agent], [f for f in since if f not in agent]
    if lost:
        overwrite += f", overwriting {whose} change to the {' and '.join(lost)}"
    if kept:
        overwrite += f"{'; ' if lost else ': '}{whose} {' and '.join(kept)} change is kept"
    return {"keep": keep, "overwrite": overwrite}


def database_choice_words(detail: dict[str, Any]) -> dict[str, str]:
    """A database undo's answers: the conflict is row by row, and either way the other rows go back."""
    n = ((detail.get("rows") or {}).get("conflict")) or 0
    rows = f"the {n:,} row{'' if n == 1 else 's'} changed since"
    return {"keep": f"Keep {rows} as they are now, and put back the rest",
            "overwrite": f"Put back {rows} too, over the newer changes (each only while it still reads as "
                         "shown here)"}


def changed_by_whom(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The fields the agent changed, and those changed since."""
    return ([r.get("field") for r in rows if r.get("left") != r.get("before")],
            [r.get("field") for r in rows if r.get("now") != r.get("left")])


def _plain(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text[:60] + "…" if len(text) > 60 else text
