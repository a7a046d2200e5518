"""The hand-built statements of the Recorder's hot path agree with the ORM.

Marked `postgres` too: `make test` runs them again on PostgreSQL, where JSON, booleans and row locks are
adapted differently."""

import json
from datetime import UTC, datetime, timedelta
from datetime import timezone as timezone_offset

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import services
from journal.models import ChainEntry, Run, Step
from journal.record import sql
from journal.record.canonical import storable_text

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def make_run(user) -> Run:
    agent, _ = services.create_agent(name="sql-bot", on_behalf_of=user)
    return Run.objects.create(agent=agent, key="run:sql", team=agent.team)


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


def _plain_values(kind):
    if kind is str:
        return st.text()
    if kind is bool:
        return st.booleans()
    if kind is float:
        return st.floats(allow_nan=False)
    if kind is int:
        return st.integers(min_value=-(2**62), max_value=2**62)
    if kind == "JSONField":
        scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
        return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(), inner, max_size=3), max_leaves=8).filter(
                                lambda value: isinstance(value, dict | list))
    zones = st.sampled_from([UTC, timezone_offset(timedelta(hours=5, minutes=30)),
                             timezone_offset(timedelta(hours=-8))])
    return st.datetimes(min_value=datetime(1970, 1, 2), timezones=zones)


_COLUMNS = [(model, field, kind) for model in (Step, Run, ChainEntry)
            for field, kind in sql._kinds(model).values() if kind is not None]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_plain_value_skips_the_orms_layers_to_the_same_parameter(data):
    """`sql._prepared`'s shortcut for values the driver takes as they are (aware datetimes, JSON) gives what
    the ORM's `get_db_prep_save` gives, for every such column of the hot path's models (a text as the record
    keeps it: `canonical.storable_text`)."""
    model, field, kind = data.draw(st.sampled_from(_COLUMNS))
    value = data.draw(_plain_values(kind))
    kept = storable_text(value) if kind is str else value  # a text as the record keeps it (U+0000 as U+FFFD)
    ours, orms = sql._prepared(value, field, kind, connection), field.get_db_prep_save(kept, connection)
    assert getattr(ours, "obj", ours) == getattr(orms, "obj", orms), (model.__name__, field.name)  # Jsonb's


def test_none_is_null_for_every_column_the_hand_built_statements_may_write():
    for model in [*apps.get_app_config("journal").get_models(),
                  *apps.get_app_config("approver").get_models()]:
        for field, kind in sql._kinds(model).values():
            assert sql._prepared(None, field, kind, connection) is None
            assert field.get_db_prep_save(None, connection) is None, (model.__name__, field.name)


def test_json_already_written_is_stored_as_it_is_and_reads_back_as_the_same_value(dana):
    run = make_run(dana)
    text = '{"a":[1,2.5,"\u00e9"],"b":null,"c":1e+21}'
    pk = sql.insert(ChainEntry, {"run_id": run.pk, "seq": 1, "ts": "t", "event": "call",
                                 "data": sql.JsonText(text), "prev_hash": "GENESIS", "hash": "h"})
    assert ChainEntry.objects.get(pk=pk).data == json.loads(text)


@pytest.mark.parametrize("parsed", [False, True])
def test_many_rows_inserted_at_once_read_back_as_each_inserted_alone(dana, parsed):
    """`insert_many` (COPY on PostgreSQL, one statement over many rows on SQLite) stores what `insert`
    stores: JSON, JSON already written, NULLs, defaults, datetimes, and texts as the record keeps them; and
    so it does with JSON written by orjson (`parsed`), an integer beyond 64 bits written the ORM's way."""
    run = make_run(dana)
    now = timezone.now()
    rows = [{"run_id": run.pk, "number": n, "server_name": "crm", "tool": "update\x00deal\u00e9",
             "arguments": {"deal": f"D-{n}", "tab\t": ["\u2028", None, 1.5, 2**53 - 1, 1e21, -0.0],
                           "big": 2**70 if n == 3 else 1},
             "started_at": now + timedelta(seconds=n), "result": None if n % 2 else {"ok": True},
             "is_error": bool(n % 3), "error_message": "line\nbreak \\ back"} for n in range(1, 7)]
    alone = [sql.insert(Step, {**row, "number": 100 + row["number"]}) for row in rows]
    sql.insert_many(Step, rows, chunk=4, parsed=parsed)
    fields = [f.attname for f in Step._meta.concrete_fields if f.attname not in ("id", "number")]
    for pk, row in zip(alone, rows, strict=True):
        one = Step.objects.values(*fields).get(pk=pk)
        many = Step.objects.values(*fields).get(run=run, number=row["number"])
        assert many == one
    assert one["tool"] == "update\ufffddeal\u00e9"  # U+0000 as the record keeps it, on every database
    sql.insert_many(ChainEntry, [{"run_id": run.pk, "seq": seq, "ts": "t", "event": "call",
                                  "data": sql.JsonText('{"c":1e+21,"s":"\u00e9"}'), "prev_hash": "p",
                                  "hash": "h"} for seq in (1, 2)])
    assert [e.data for e in ChainEntry.objects.filter(run=run)] == [{"c": 1e21, "s": "\u00e9"}] * 2
