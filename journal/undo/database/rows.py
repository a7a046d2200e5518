"""A database call's rows, as its undo reads them: each row's net change over the call (`net`), and how a row
reads now against it (`judge`): as the agent left it (the undo restores it), as before the call (already
undone), or changed since in a field the agent changed, or deleted or re-created (a conflict, shown before /
agent / now). Fields the agent did not change that someone changed since are kept, and said so. No ORM and no
clock."""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .reading import plural

RESTORE, UNDONE, CONFLICT = "restore", "undone", "conflict"
INSERTED, UPDATED, DELETED = "I", "U", "D"
SAMPLE = 5  # rows shown as a sample of those that will be restored


@dataclass
class Change:
    """One row's change over a call: the row before it (None: the call inserted it) and after it (None: the
    call deleted it), from the first and last of its captured changes."""

    table: str
    key: list
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    ids: list[int] = field(default_factory=list)
    _identity: str = field(default="", repr=False, compare=False)
    _fields: list[str] | None = field(default=None, repr=False, compare=False)

    @property
    def op(self) -> str:
        if self.before is None:
            return INSERTED
        return DELETED if self.after is None else UPDATED

    @property
    def fields(self) -> list[str]:
        """The fields the agent changed: every field of a row it inserted or deleted (worked out once the
        change is whole: `net` has set its last after)."""
        if self._fields is None:
            if self.op == UPDATED:
                self._fields = [name for name in self.before if self.before.get(name) != self.after.get(name)]
            else:
                self._fields = list((self.after or self.before).keys())
        return self._fields

    def identity(self) -> str:
        """The row, as plans and checks name it (`identity_of`)."""
        if not self._identity:
            self._identity = identity_of(self.table, self.key)
        return self._identity


def identity_of(table: str, key: list) -> str:
    """A row as plans and checks name it: its table and key, in JSON."""
    try:
        return orjson.dumps([table, key], option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # an integer past 64 bits
        return json.dumps([table, key], ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def net(rows: Iterable[Mapping[str, Any]]) -> list[Change]:
    """The captured rows of a call (in change order), one net change per row: a row inserted then deleted
    is no change at all, and a row updated twice is updated from its first before to its last after."""
    changes: dict[str, Change] = {}
    for row in rows:
        change = Change(row["table"], list(row["key"]), row.get("before"), row.get("after"), [row["id"]])
        known = changes.get(change.identity())
        if known is None:
            changes[change.identity()] = change
        else:
            known.after = change.after
            known.ids.append(row["id"])
    return [c for c in changes.values() if not (c.before is None and c.after is None) and c.before != c.after]


@dataclass(frozen=True)
class Judged:
    state: str  # restore | undone | conflict
    change: Change
    conflicts: tuple[str, ...] = ()  # the agent's fields changed since (or "(row)": deleted or re-created)
    kept: tuple[str, ...] = ()  # fields the agent did not change that someone changed since

    def as_detail(self, now: Mapping[str, Any] | None) -> dict[str, Any]:
        """The row as the plan shows it: before / agent / now for each field that matters."""
        shown = self.conflicts if self.state == CONFLICT else self.kept
        fields = [{"field": name, "before": (self.change.before or {}).get(name),
                   "agent": (self.change.after or {}).get(name), "now": (now or {}).get(name)}
                  for name in shown if name != ROW]
        detail = {"table": self.change.table, "key": self.change.key, "op": self.change.op, "fields": fields}
        if ROW in shown:
            detail["row"] = "deleted since" if now is None else "re-created since"
        return detail


ROW = "(row)"


def judge(change: Change, now: Mapping[str, Any] | None) -> Judged:
    """How the row reads now (`now`: as the capture writes a row; None when there is no row with its key)."""
    if change.op == INSERTED:
        if now is None:
            return Judged(UNDONE, change)
        differ = tuple(name for name in change.after if now.get(name) != change.after.get(name))
        return Judged(CONFLICT, change, differ) if differ else Judged(RESTORE, change)
    if change.op == DELETED:
        if now is None:
            return Judged(RESTORE, change)
        if dict(now) == change.before:
            return Judged(UNDONE, change)
        return Judged(CONFLICT, change, (ROW,))
    if now is None:
        return Judged(CONFLICT, change, (ROW,))
    mine = change.fields
    kept = tuple(name for name in change.after
                 if name not in mine and now.get(name) != change.after.get(name))
    if all(now.get(name) == change.after.get(name) for name in mine):
        return Judged(RESTORE, change, kept=kept)
    if all(now.get(name) == change.before.get(name) for name in mine):
        return Judged(UNDONE, change, kept=kept)
    return Judged(CONFLICT, change, tuple(n for n in mine if now.get(n) != change.after.get(n)), kept)


VERBS = {INSERTED: "deletes", UPDATED: "puts back", DELETED: "re-inserts"}


class Tally:
    """What an undo of rows judged a batch at a time would do, counted per table, kind of change and state
    (`add`), in words (`summary`)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], dict[str, int]] = {}

    def add(self, judged: Iterable[Judged]) -> "Tally":
        for one in judged:
            counts = self.groups.setdefault((one.change.table, one.change.op),
                                            {RESTORE: 0, UNDONE: 0, CONFLICT: 0, "kept": 0})
            counts[one.state] += 1
            counts["kept"] += 1 if one.kept and one.state == RESTORE else 0
        return self

    def summary(self) -> dict[str, Any]:
        tables: dict[str, dict[str, int]] = {}
        for (table, _), counts in self.groups.items():
            into = tables.setdefault(table, {RESTORE: 0, UNDONE: 0, CONFLICT: 0, "kept": 0})
            for state, n in counts.items():
                into[state] += n
        words = [_group_words(table, op, counts) for (table, op), counts in self.groups.items()]
        return {"tables": tables, "words": "; ".join(words)}


def summary(judged: list[Judged]) -> dict[str, Any]:
    """What an undo of these rows would do, counted per table, kind of change and state, in words: "put back
    40 rows of contacts: 38 as the agent left them; 2 changed since by someone else, kept as they are"."""
    return Tally().add(judged).summary()


GROUP_WORDS = {UPDATED: "put back {rows} of {table}",
               DELETED: "re-insert {rows} of {table} the agent deleted",
               INSERTED: "delete the {rows} of {table} the agent inserted"}


def _group_words(table: str, op: str, counts: dict[str, int]) -> str:
    total = counts[RESTORE] + counts[UNDONE] + counts[CONFLICT]
    head = GROUP_WORDS[op].format(rows=plural(total, "row"), table=table)
    parts = [f"{counts[RESTORE]:,} as the agent left them" if counts[RESTORE] else ""]
    if counts["kept"]:
        parts.append(f"{counts['kept']:,} of those with other fields changed since, which are kept")
    if counts[CONFLICT]:
        parts.append(f"{counts[CONFLICT]:,} changed since by someone else, kept as they are unless the "
                     "approvers choose to overwrite them")
    if counts[UNDONE]:
        parts.append(f"{counts[UNDONE]:,} already as before the call")
    return f"{head}: " + "; ".join(p for p in parts if p)


def changed_words(tables: Mapping[str, Mapping[str, int]]) -> str:
    """What a call changed, from its captured counts: "updated 40 rows of contacts; deleted 25"."""
    verbs = (("I", "inserted"), ("U", "updated"), ("D", "deleted"))
    parts = []
    for table, counts in tables.items():
        said = [f"{word} {plural(counts.get(op, 0), 'row')}" for op, word in verbs if counts.get(op)]
        if said:
            parts.append(f"{', '.join(said)} of {table}")
    return "; ".join(parts) or "changed no rows"
