"""A database undo, run by the worker (journal.undo.database): the rows the agent's call changed, put back
through the Recorder's own connection in one transaction, each only where it still reads as the agent left
it (or, for a row the approvers chose to overwrite, as they saw it); rows changed since in a field the agent
changed are left alone as signed. Journaled as a step of the plan's compensation run, like any undo; a
marker written in the same transaction means a worker killed anywhere never puts a row back twice."""

from typing import Any

from django.utils import timezone

from journal import services as journal_services
from journal.undo.database.judging import RESTORE_TOOL
from journal.undo.database.reading import plural
from journal.undo.database.rows import identity_of
from journal.upstream import database, restore, snapshots
from journal.upstream.captured import NotInCapture
from journal.upstream.snapshots import KeptRows

from .. import database_checks, execution
from ..models import Plan, PlanItem


def plan_of_rows(item: PlanItem) -> tuple[dict[str, Any], set[str]]:
    """What the approvers signed for the rows that changed since in a field the agent changed: ({row: how it
    must read for its undo to run}, the rows they chose to leave alone). Such a row is left alone, unless
    they chose to overwrite: then it runs where it still reads as they saw it. Every other row runs where it
    reads as the agent left it."""
    conflicting = {}
    if item.check_status == PlanItem.Check.CONFLICT:
        conflicting = {identity_of(c["table"], c["key"]): c.get("now")
                       for c in (item.check_detail or {}).get("conflicts") or ()}
    if item.conflict_choice == PlanItem.Choice.OVERWRITE:
        return conflicting, set()
    return {}, set(conflicting)


def words(detail: dict[str, Any]) -> str:
    """"Put back 38 rows of contacts; 2 changed since by someone else were left as they are"."""
    parts = []
    for table, counts in (detail.get("tables") or {}).items():
        if "recreated" in counts:  # a table kept before an approved destruction
            parts.append(kept_table_words(table, counts))
            continue
        said = [undone_words(table, counts.get("byOp") or {"U": counts["restored"]})]
        if counts.get("changedSince"):
            n = counts["changedSince"]
            left = "it is" if n == 1 else "they are"
            said.append(f"{plural(n, 'row')} changed since the check, left as {left}")
        if counts.get("left"):
            said.append(f"{plural(counts['left'], 'row')} changed since by someone else, kept as the "
                        "approvers chose")
        parts.append("; ".join(said))
    text = "; ".join(parts) or "put back no rows"
    again = " (it had run already: nothing was done twice)" if detail.get("again") else ""
    return f"{text[0].upper()}{text[1:]}{again}."


def kept_table_words(table: str, counts: dict[str, Any]) -> str:
    """"re-created table contacts and reloaded its 1,196 rows", or why it was left as it is."""
    if counts.get("left"):
        now = "gone" if counts["left"] == "gone" else "not empty"
        return f"left {table} as it is: it was {now}, not as the undo found it when checked"
    if counts.get("recreated"):
        return f"re-created table {table} and reloaded its {plural(counts['restored'], 'row')}"
    return f"reloaded {plural(counts['restored'], 'row')} into {table}"


def undone_words(table: str, by_op: dict[str, int]) -> str:
    """"put back 39 rows of contacts; re-inserted 25 deleted rows of contacts"."""
    inserted = f"deleted the {plural(by_op.get('I', 0), 'row')} of {table} the agent inserted"
    said = [f"put back {plural(by_op['U'], 'row')} of {table}" if by_op.get("U") else "",
            f"re-inserted {plural(by_op['D'], 'deleted row')} of {table}" if by_op.get("D") else "",
            inserted if by_op.get("I") else ""]
    return "; ".join(s for s in said if s) or f"put back no rows of {table}"


def attempt(plan: Plan, item: PlanItem, attempt: int, *, run_id: int) -> execution.Verdict:
    """One try at a database undo, journaled as a call of the plan's compensation run."""
    rows, why = database_checks.rows_of(item.step.earlier_state)
    if rows is None:
        return execution.Verdict(execution.COMPENSATION_FAILED,
                                 {"message": f"Its rows cannot be put back: {why}."})
    overrides, leave = plan_of_rows(item)
    started = timezone.now()
    opened = journal_services.open_step_in_run(
        run_id=run_id, server=item.step.server, tool=RESTORE_TOOL, arguments=item.arguments or {},
        request_meta={"hatp/journal": {"idempotencyKey": item.idempotency_key}}, now=started,
        who={"executor": "undo", "plan": str(plan.public_id), "attempt": attempt,
             "undoes": {"run": str(item.step.run.public_id), "step": item.step.number}})
    PlanItem.objects.filter(pk=item.pk).update(call_step_id=opened.step_id)
    try:
        if isinstance(rows, KeptRows):
            detail = snapshots.put_back(item.step.server.database, list(rows.snapshots.values()),
                                        marker=item.idempotency_key)
        else:
            detail = restore.put_back(item.step.server.database, rows, marker=item.idempotency_key,
                                      overrides=overrides, leave=leave)
    except NotInCapture as exc:  # nothing was changed; the rows it needs are gone for good
        message = f"The rows could not be put back, and none was: {exc}."
        journal_services.close_step(opened=opened, started=started, finished=timezone.now(),
                                    outcome=journal_services.Outcome(error_message=message,
                                                                     failure_class="unknown"))
        return execution.Verdict(execution.COMPENSATION_FAILED, {"message": message})
    except database.DatabaseUnreachable as exc:  # its transaction never committed: safe to try again
        message = f"The rows could not be put back, and none was: {exc}"
        journal_services.close_step(opened=opened, started=started, finished=timezone.now(),
                                    outcome=journal_services.Outcome(error_message=message,
                                                                     failure_class="transient"))
        return execution.Verdict(execution.COMPENSATION_FAILED, {"message": message},
                                 retry=attempt < execution.MAX_ATTEMPTS)
    text = words(detail)
    answer = {"content": [{"type": "text", "text": text}], "structuredContent": detail}
    journal_services.close_step(opened=opened, started=started, finished=timezone.now(),
                                outcome=journal_services.Outcome(result=answer))
    return verdict_of(detail, text)


def verdict_of(detail: dict[str, Any], text: str) -> execution.Verdict:
    """Put back at least one row: compensated (the report says what was left and why); none, because every
    row changed since: a conflict; none, because the approvers left them all: skipped."""
    kept = {"message": text, "rows": detail}
    if detail.get("restored"):
        return execution.Verdict(execution.COMPENSATED, kept)
    if detail.get("changedSince"):
        return execution.Verdict(execution.CONFLICT, kept)
    if detail.get("left"):
        return execution.Verdict(execution.SKIPPED, kept)
    return execution.Verdict(execution.ALREADY_UNDONE, kept)

