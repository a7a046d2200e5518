"""The retry guard's question: did an earlier attempt of the same call reach its server, with an outcome the
agent never learnt? A repeat of such a call is held for a person (docs/design.md, "Retries")."""

from typing import Any

from ..models import Run, Step
from ..record import sql

# What became of an earlier attempt, in the words of a held repeat's reason.
_UNKNOWN_WORDS = {
    Step.Status.ERROR: "no answer came back",
    Step.Status.CANCELLED: "cancelled while the server had it",
    Step.Status.UNDELIVERED: "the server answered, but the agent never got the answer",
}


def unknown_attempt(digest: str) -> dict[str, Any] | None:
    """The latest earlier attempt of the same call (agent, server, tool, arguments) that reached the server,
    if its outcome is unknown to the agent: what the retry guard holds a repeat for. An attempt that never
    went out (stopped by a policy, or cancelled before it was sent) does not count, so a denied or expired
    repeat does not hide the attempt that may have acted. One indexed read. `one_statement._open_sql` asks
    the same in SQL (`_ATTEMPTED`): a change here is a change there."""
    row = sql.first_row(
        Step, ("number", "run_id", "status", "may_have_acted"),
        "call_digest = %s AND status IN (%s, %s, %s, %s) AND failure_class <> %s "
        "AND NOT (status = %s AND may_have_acted = %s) ORDER BY id DESC LIMIT 1",
        [digest, Step.Status.OK, Step.Status.ERROR, Step.Status.UNDELIVERED, Step.Status.CANCELLED,
         Step.FailureClass.POLICY, Step.Status.CANCELLED, sql.prep(Step, "may_have_acted", False)])
    if row is None:
        return None
    number, run_id, status, may_have_acted = row
    if not may_have_acted:
        return None
    public_id = Run.objects.filter(pk=run_id).values_list("public_id", flat=True).first()
    return {
        "step": number,
        "run": str(public_id),
        "status": status,
        "what": _UNKNOWN_WORDS.get(status, status),
    }
