"""The hand-built statements of the Recorder's hot path agree with the ORM.

Marked `postgres` too: `make test` runs them again on PostgreSQL, where JSON, booleans and row locks are
adapted differently."""

import pytest
from django.db import transaction
from django.utils import timezone

from journal import services, sql
from journal.models import Run, Step

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def make_run(user) -> Run:
    agent, _ = services.create_agent(name="sql-bot", on_behalf_of=user)
    return Run.objects.create(agent=agent, key="run:sql")


def test_an_inserted_row_reads_back_through_the_orm_with_model_defaults(dana):
    run = make_run(dana)
    now = timezone.now()
    pk = sql.insert(Step, {"run_id": run.pk, "number": 1, "server_name": "crm", "tool": "update_deal",
                           "arguments": {"deal": "D-1", "nested": [1, "two", None]}, "started_at": now})
    step = Step.objects.get(pk=pk)
    assert step.arguments == {"deal": "D-1", "nested": [1, "two", None]}
    assert step.started_at == now
    # Defaults as the ORM would have written them: JSON defaults, SQL NULLs, blank strings.
    assert step.status == Step.Status.PENDING and step.declaration == {} and step.undo_problems == []
    assert step.result is None and step.request_meta is None and step.receipt_verified is None
    assert step.error_message == "" and step.is_error is False


def test_a_field_the_model_does_not_have_is_refused(dana):
    run = make_run(dana)
    with pytest.raises(TypeError, match="no field"):
        sql.insert(Step, {"run_id": run.pk, "number": 1, "server_name": "crm", "tool": "t",
                          "started_at": timezone.now(), "colour": "red"})


def test_a_conditional_update_changes_nothing_once_its_guard_no_longer_holds(dana):
    run = make_run(dana)
    pk = sql.insert(Step, {"run_id": run.pk, "number": 1, "server_name": "crm", "tool": "t",
                           "started_at": timezone.now()})
    first = sql.update(Step, pk, {"status": Step.Status.OK, "result": {"ok": True}},
                       only_if={"status": Step.Status.PENDING})
    second = sql.update(Step, pk, {"status": Step.Status.ERROR}, only_if={"status": Step.Status.PENDING})
    assert (first, second) == (1, 0)
    step = Step.objects.get(pk=pk)
    assert step.status == Step.Status.OK and step.result == {"ok": True}


def test_a_locked_row_loads_only_what_was_asked_and_the_rest_on_demand(dana):
    run = make_run(dana)
    Run.objects.filter(pk=run.pk).update(head_seq=7, head_hash="abc", step_count=3)
    with transaction.atomic():
        # Asked out of model order on purpose: the helper puts the columns back in order.
        locked = sql.locked_row(Run, ("head_hash", "id", "head_seq", "step_count"), "id = %s", [run.pk])
    assert (locked.pk, locked.head_seq, locked.head_hash, locked.step_count) == (run.pk, 7, "abc", 3)
    assert locked.get_deferred_fields() >= {"public_id", "started_at"}
    assert locked.public_id == run.public_id  # loaded on first access
    with transaction.atomic():
        assert sql.locked_row(Run, ("id",), "id = %s", [run.pk + 1000]) is None
