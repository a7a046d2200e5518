"""The journaling step (`journal.services.steps`): a call's intent is on the record before it is
forwarded, its outcome after, each in one short transaction with the run's row locked; an outcome closes a
step once, and a step the Recorder never heard back about is closed by the reconciler as unknown."""

from datetime import UTC, datetime, timedelta

import pytest

from journal import services
from journal.models import ChainEntry, Run, Step

from ..factories import crm_server

pytestmark = pytest.mark.django_db

AT = datetime(2026, 11, 29, 10, tzinfo=UTC)


@pytest.fixture
def agent(dana):
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    return agent


def opened(agent, server=None, **kwargs):
    return services.open_step(agent=agent, run_key="run:task", server=server, server_name="crm",
                              tool="update_deal", arguments={"deal_id": "D-881"}, request_meta=None, now=AT,
                              **kwargs)


def events(run_id):
    return list(ChainEntry.objects.filter(run_id=run_id).order_by("seq").values_list("event", flat=True))


def test_the_intent_is_on_the_record_before_the_call_goes_out(agent):
    step = opened(agent, server=crm_server())
    row = Step.objects.get(pk=step.step_id)
    assert (row.status, row.number, row.reversibility) == ("pending", 1, "compensate")
    assert events(step.run_id) == ["run", "call"]
    call = ChainEntry.objects.get(run_id=step.run_id, event="call").data
    assert call["arguments"] == {"deal_id": "D-881"} and call["agent"] == "sales-bot" and "policy" not in call


def test_the_outcome_closes_the_step_with_its_undo_facts_and_counts(agent):
    step = opened(agent, server=crm_server())
    result = {"content": [], "_meta": {"hatp/journal": {"compensationToken": "ctk_1",
                                                        "effect": {"summary": "Won", "version": "v2"}}}}
    closed = services.close_step(opened=step, outcome=services.Outcome(result=result), started=AT,
                                 finished=AT + timedelta(milliseconds=40))
    assert closed.status == "ok" and closed.compensation_arguments == {"compensationToken": "ctk_1"}
    run = Run.objects.get(pk=step.run_id)
    assert (run.step_count, run.reversible_count, run.failed_count) == (1, 1, 0)
    entry = ChainEntry.objects.get(run_id=step.run_id, event="result").data
    assert entry["effect"]["version"] == "v2" and entry["durationMs"] == 40.0
    assert Step.objects.get(pk=step.step_id).result_seq == 3


def test_a_late_outcome_changes_nothing_once_the_step_is_closed(agent):
    step = opened(agent)
    first = services.close_step(opened=step, outcome=services.Outcome(error_message="timed out",
                                                                      failure_class="transient",
                                                                      may_have_acted=True),
                                started=AT, finished=AT + timedelta(seconds=30))
    late = services.close_step(opened=step, outcome=services.Outcome(result={"content": []}), started=AT,
                               finished=AT + timedelta(seconds=31))
    assert first.status == "error" and late is None
    assert Step.objects.get(pk=step.step_id).status == "error" and events(step.run_id).count("result") == 1
    assert Run.objects.get(pk=step.run_id).unknown_count == 1  # it may have acted


def test_a_call_the_policy_holds_opens_held_and_a_refusal_closes_it_without_forwarding(agent):
    step = opened(agent, decide=lambda declaration, retry_of=None: {"decision": "ask", "class": "unknown"})
    assert Step.objects.get(pk=step.step_id).status == "held"
    assert services.refuse_step(opened=step, message="Not approved in time.", now=AT + timedelta(minutes=5))
    row = Step.objects.get(pk=step.step_id)
    assert (row.status, row.failure_class, row.error_message) == ("error", "policy", "Not approved in time.")
    assert ChainEntry.objects.get(run_id=step.run_id, event="result").data["forwarded"] is False


def test_the_reconciler_closes_a_step_whose_answer_was_never_recorded_as_unknown(agent):
    step = opened(agent)
    later = AT + timedelta(minutes=5)
    assert services.reconcile_stale_steps(older_than=later, now=later) == 1
    row = Step.objects.get(pk=step.step_id)
    assert (row.status, row.may_have_acted, row.reversibility) == ("error", True, "unknown")
    assert services.reconcile_stale_steps(older_than=later) == 0  # safe to run twice


@pytest.mark.postgres
def test_calls_journaled_in_one_group_lock_their_run_once_and_keep_its_chain_whole(agent, settings):
    # The usual way: SQLite's, and PostgreSQL's when a check sends a call there (test_one_statement.py).
    settings.RECORDER_ONE_STATEMENT = False
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from journal.record import sql

    server = crm_server()
    result = {"content": [], "_meta": {"hatp/journal": {"compensationToken": "ctk_1",
                                                        "effect": {"summary": "Won", "version": "v2"}}}}
    with CaptureQueriesContext(connection) as captured, transaction.atomic(), sql.one_moment():
        steps = [services.open_step(agent=agent, run_key="", server=server, server_name="crm",
                                    tool="update_deal", arguments={"deal_id": f"D-{n}"}, request_meta=None,
                                    now=AT) for n in range(3)]
        for step in steps:
            services.close_step(opened=step, outcome=services.Outcome(result=result), started=AT, finished=AT)
    run_reads = [q["sql"] for q in captured.captured_queries
                 if q["sql"].startswith('SELECT "id", "state", "step_count"')]
    # The first job looks the run up, finds none and locks the one it opens; the rest find it held.
    assert len(run_reads) == 2
    assert {step.run_id for step in steps} == {steps[0].run_id}
    run = Run.objects.get(pk=steps[0].run_id)
    assert (run.step_count, run.head_seq, run.reversible_count) == (3, 7, 3)
    assert events(run.pk) == ["run", "call", "call", "call", "result", "result", "result"]
    assert services.verify_run(run=run).ok
    # Outside a group every call finds its run again.
    with CaptureQueriesContext(connection) as captured:
        services.open_step(agent=agent, run_key="", server=server, server_name="crm", tool="update_deal",
                           arguments={"deal_id": "D-9"}, request_meta=None, now=AT)
    assert len([q for q in captured.captured_queries if q["sql"].startswith('SELECT "id", "state"')]) == 1
