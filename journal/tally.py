"""A run's steps counted as a person reads them, every step in exactly one kind: the run page's header says
"7 steps: 5 reversible, 1 read-only, 1 held for approval", never counts that leave steps out.

Pure: the caller passes the steps' kinds as the database grouped them.
"""

from collections.abc import Iterable

# In the order the header names them.
KINDS = (
    ("reversible", "reversible"),
    ("none", "cannot be undone"),
    ("unknown", "unknown"),
    ("read_only", "read-only"),
    ("held", "held for approval"),
    ("in_flight", "in flight"),
    ("not_sent", "not sent (stopped by a policy)"),
    ("failed", "failed, changing nothing"),
)


def kind(*, status: str, reversibility: str, failure_class: str, may_have_acted: bool) -> str:
    """Which one kind of `KINDS` a step is."""
    if status == "held":
        return "held"
    if status == "pending":
        return "in_flight"
    if status == "error" and failure_class == "policy":
        return "not_sent"
    if status == "error" and not may_have_acted and reversibility != "read_only":
        return "failed"
    return {"compensate": "reversible", "none": "none", "read_only": "read_only"}.get(reversibility,
                                                                                      "unknown")


def header(groups: Iterable[tuple[str, str, str, bool, int]]) -> str:
    """"7 steps: 5 reversible, 1 read-only, 1 held for approval" from (status, reversibility, failure class,
    may have acted, how many) groups."""
    counts: dict[str, int] = {}
    for status, reversibility, failure_class, may_have_acted, n in groups:
        key = kind(status=status, reversibility=reversibility, failure_class=failure_class,
                   may_have_acted=may_have_acted)
        counts[key] = counts.get(key, 0) + n
    total = sum(counts.values())
    steps = f"{total} step{'' if total == 1 else 's'}"
    parts = [f"{counts[key]} {words}" for key, words in KINDS if counts.get(key)]
    return f"{steps}: {', '.join(parts)}" if parts else steps
