"""A call's intent and its outcome as one statement each on PostgreSQL (`journal.services.one_statement`):
one round trip a transition, and a record identical to the one the usual way writes, for every kind of call
and outcome, and for every check that sends a call the usual way (a new run, a halted run, an earlier attempt
whose outcome is unknown, links to earlier results, links the agent declared, an imported run).

Marked `postgres`: `make test` runs them again on PostgreSQL, where the statement is used; on SQLite they
check the usual way against itself."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from journal import services
from journal.models import ChainEntry, Checkpoint, Run, RunValue, Step, StepDependency
from journal.record import sql
from journal.services.record import ForeignRun
from journal.undo import dependencies

from ..factories import crm_server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

AT = datetime(2026, 12, 7, 10, tzinfo=UTC)
WON = {"content": [{"type": "text", "text": "Deal D-881: Won"}],
       "structuredContent": {"deal": {"id": "DEAL-8f3a2c91", "stage": "Won"}},
       "_meta": {"hatp/journal": {"compensationToken": "ctk_1",
                                  "effect": {"summary": "Won", "version": "v2"}}}}
RUN_FIELDS = ("step_count", "head_seq", "checkpointed_seq", "state", "reversible_count", "irreversible_count",
              "unknown_count", "failed_count", "halted_by_plan", "last_activity_at")


@pytest.fixture
def agent(dana):
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    return agent


def remembered_decisions(declaration, retry_of=None):
    """An autonomy policy that allows every call and says what earlier attempt it was told of."""
    return {"decision": "allow", "retryOf": retry_of}


def call(agent, server, n, *, key="run:task", arguments=None, meta=None, outcome=None):
    at = AT + timedelta(seconds=n)
    opened = services.open_step(agent=agent, run_key=key, server=server, server_name="crm",
                                tool="update_deal", arguments=arguments or {"deal_id": f"D-{n}"},
                                request_meta=meta, now=at, decide=remembered_decisions)
    outcome = outcome or services.Outcome(result=WON)
    return opened, services.close_step(opened=opened, outcome=outcome, started=at,
                                       finished=at + timedelta(milliseconds=25))


def journey(agent, server):
    """Every kind of call and outcome, and every check that sends a call the usual way."""
    call(agent, server, 1)  # a new run: created the usual way, its call at once
    call(agent, server, 2)
    call(agent, server, 3, arguments={"deal_id": "DEAL-8f3a2c91"})  # an earlier result's value: linked
    call(agent, server, 4, meta={"hatp/journal": {"dependsOn": [2]}})  # a link the agent declares
    lost = services.Outcome(error_message="timed out", failure_class="timeout", may_have_acted=True)
    call(agent, server, 5, arguments={"deal_id": "D-lost"}, outcome=lost)  # failed: the run fails
    call(agent, server, 6, arguments={"deal_id": "D-lost"})  # a repeat of it: the policy is told of it
    tool_error = services.Outcome(result={"content": [{"type": "text", "text": "no such stage"}],
                                          "isError": True})
    call(agent, server, 7, outcome=tool_error)
    Run.objects.filter(key="run:task").update(halted_by_plan="00000000-0000-0000-0000-000000000000")
    call(agent, server, 8)  # a halted run (its plan unknown here, so the halt is released)
    for n in range(9, 12):
        call(agent, server, n, key="run:other")
    opened = services.open_step(agent=agent, run_key="run:task", server=server, server_name="crm",
                                tool="update_deal", arguments={"deal_id": "D-12"}, request_meta=None,
                                now=AT + timedelta(seconds=12), decide=remembered_decisions)
    services.close_step(opened=opened, outcome=services.Outcome(result=WON), started=AT, finished=AT)
    # A late outcome of a step closed already changes nothing.
    assert services.close_step(opened=opened, outcome=services.Outcome(result=WON), started=AT,
                               finished=AT) is None


def record():
    """What the record says, without what differs from one writing to the next (ids, hashes)."""
    names = {str(public_id): key for public_id, key in Run.objects.values_list("public_id", "key")}

    def named(value):  # a run's public id in an entry, by its key
        text = json.dumps(value)
        for public_id, key in names.items():
            text = text.replace(public_id, key)
        return json.loads(text)

    runs = {}
    for run in Run.objects.order_by("key"):
        numbers = dict(Step.objects.filter(run=run).values_list("id", "number"))
        runs[run.key] = {
            "run": [getattr(run, name) for name in RUN_FIELDS],
            "entries": [(e.seq, e.ts, e.event, named(e.data))
                        for e in ChainEntry.objects.filter(run=run, seq__gt=1).order_by("seq")],
            "steps": list(Step.objects.filter(run=run).order_by("number").values(
                "number", "status", "tool", "arguments", "request_meta", "declaration",
                "reversibility", "result", "result_seq", "is_error", "error_message", "failure_class",
                "may_have_acted", "started_at", "finished_at", "compensation_arguments", "call_digest")),
            "decisions": [named(d) for d in Step.objects.filter(run=run).order_by("number")
                          .values_list("policy_decision", flat=True)],
            "links": sorted((numbers[d.step_id], numbers[d.depends_on_id], d.rule, str(d.pointers))
                            for d in StepDependency.objects.filter(step__run=run)),
            "values": sorted((v.digest, numbers[v.step_id], v.pointer, v.seen)
                             for v in RunValue.objects.filter(run=run)),
            "checkpoints": list(Checkpoint.objects.filter(run=run).order_by("seq").values_list("seq",
                                                                                             flat=True)),
        }
        assert services.verify_run(run=run).ok, run.key
    return runs


def both_ways(settings, calls, agent) -> tuple[dict, dict]:
    """The record `calls(agent, server)` writes with the one statement, then the usual way."""
    server = crm_server()
    calls(agent, server)
    at_once = record()
    Run.objects.all().delete()
    settings.RECORDER_ONE_STATEMENT = False
    calls(agent, server)
    return at_once, record()


def test_each_call_writes_the_record_the_usual_way_writes(agent, settings):
    settings.RECORDER_CHECKPOINT_EVERY = 5
    at_once, usual = both_ways(settings, journey, agent)
    for key, found in at_once.items():
        for part, value in found.items():
            assert usual[key][part] == value, (key, part)
    task = at_once["run:task"]
    assert [link[:3] for link in task["links"]] == [(3, 2, "inferred"), (4, 2, "declared")]
    assert task["decisions"][5]["retryOf"]["step"] == 5  # the guard found the repeat
    assert task["run"][3] == "failed" and task["run"][8] == ""  # failed; the halt released
    assert task["checkpoints"] and at_once["run:other"]["run"][0] == 3


def test_a_call_is_one_statement_each_way_on_postgresql(agent):
    """On SQLite, where a statement costs no round trip, the usual four or five statements each way."""
    server = crm_server()
    call(agent, server, 1)  # the run exists
    at = AT + timedelta(seconds=2)
    with CaptureQueriesContext(connection) as intent:
        opened = services.open_step(agent=agent, run_key="run:task", server=server, server_name="crm",
                                    tool="update_deal", arguments={"deal_id": "DEAL-8f3a2c91"},
                                    request_meta=None, now=at, decide=remembered_decisions)
    with CaptureQueriesContext(connection) as outcome:  # linked to step 1's result, inside the statement
        closed = services.close_step(opened=opened, outcome=services.Outcome(result=WON), started=at,
                                     finished=at)
    # The test's own transaction makes each `atomic` a savepoint; the journal's groups make none.
    statements = [[q["sql"].lstrip()[:8] for q in captured.captured_queries
                   if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
                  for captured in (intent, outcome)]
    if connection.vendor == "postgresql":
        assert statements == [["WITH run"], ["WITH run"]]
    else:
        assert len(statements[0]) >= 4 and len(statements[1]) >= 4
    assert closed.status == "ok" and closed.result_seq == 5
    assert services.verify_run(run=Run.objects.get(pk=opened.run_id)).ok
    link = StepDependency.objects.get(step_id=closed.pk)
    assert (link.depends_on.number, link.rule) == (1, "inferred")
    assert link.pointers == [{"from": "/structuredContent/deal/id", "to": "/deal_id"}]


# Keys JCS and PostgreSQL's `to_json` must write alike: quotes, backslashes, control characters, U+2028,
# non-ASCII, a character beyond the Basic Multilingual Plane.
ODD_KEYS = ['say "hi"', "back\\slash", "tab\there\n", "\x01\x1f\x7f", "line\u2028sep", "caf\u00e9",
            "\U0001f600/~"]


def linked_journey(agent, server):
    """Calls whose arguments carry earlier results' values under odd keys: links by many pointers, to
    several steps, past the most a call may have (MAX_LINKS), and a value too common to link by."""
    for n, key in enumerate(ODD_KEYS, start=1):
        result = {"content": [], "structuredContent": {key: {"id": f"ID-{n}-7f3a9c", "k": "common-91ab3f"}}}
        call(agent, server, n, arguments={"n": n}, outcome=services.Outcome(result=result))
    carried = {key: f"ID-{n}-7f3a9c" for n, key in enumerate(ODD_KEYS, start=1)}
    call(agent, server, 20, arguments={**carried, "again": "ID-1-7f3a9c", "c": "common-91ab3f"})
    for n in range(21, 21 + dependencies.MAX_LINKS + 2):  # more steps with a value than a call may link
        result = {"content": [], "structuredContent": {"v": f"MANY-{n}-c0ffee", "w": "W-5d1e7a"}}
        call(agent, server, n, arguments={"n": n}, outcome=services.Outcome(result=result))
    many = [f"MANY-{n}-c0ffee" for n in range(21, 21 + dependencies.MAX_LINKS + 2)]
    call(agent, server, 60, arguments={"all": many, "w": "W-5d1e7a"})  # W-…: in every one, too common


def test_links_chosen_in_the_statement_are_the_links_python_chooses(agent, settings):
    at_once, usual = both_ways(settings, linked_journey, agent)
    assert usual == at_once
    links = at_once["run:task"]["links"]
    assert sum(1 for link in links if link[0] == len(ODD_KEYS) + 1) == len(ODD_KEYS)  # one a step it carries
    assert sum(1 for link in links if link[0] == len(ODD_KEYS) + 2 + dependencies.MAX_LINKS + 2) \
        == dependencies.MAX_LINKS  # the most recent ones only


def test_an_imported_runs_record_is_never_added_to(agent):
    server = crm_server()
    call(agent, server, 1)
    opened = services.open_step(agent=agent, run_key="run:task", server=server, server_name="crm",
                                tool="update_deal", arguments={"deal_id": "D-2"}, request_meta=None, now=AT)
    Run.objects.filter(pk=opened.run_id).update(state=Run.State.IMPORTED)
    with pytest.raises(ForeignRun):
        services.close_step(opened=opened, outcome=services.Outcome(result=WON), started=AT, finished=AT)
    with pytest.raises(ForeignRun):
        services.open_step(agent=agent, run_key="run:task", server=server, server_name="crm",
                           tool="update_deal", arguments={"deal_id": "D-3"}, request_meta=None, now=AT)
    assert Run.objects.get(pk=opened.run_id).head_seq == 4


def test_calls_journaled_in_one_group_each_take_one_statement_and_keep_their_runs_chains_whole(agent):
    """As the journal thread runs a group: one transaction, one moment, statements pipelined."""
    server = crm_server()
    call(agent, server, 1, key="run:a")
    call(agent, server, 2, key="run:b")
    with CaptureQueriesContext(connection) as captured, transaction.atomic(), sql.pipelined(), \
            sql.one_moment():
        steps = [services.open_step(agent=agent, run_key=key, server=server, server_name="crm",
                                    tool="update_deal", arguments={"deal_id": f"D-{n}"}, request_meta=None,
                                    now=AT, decide=remembered_decisions)
                 for n, key in enumerate(["run:a", "run:b", "run:a", "run:b"])]
        for step in reversed(steps):
            services.close_step(opened=step, outcome=services.Outcome(result=WON), started=AT, finished=AT)
    if connection.vendor == "postgresql":
        assert [q["sql"].lstrip()[:8] for q in captured.captured_queries
                if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))] == ["WITH run"] * 8
    for key in ("run:a", "run:b"):
        run = Run.objects.get(key=key)
        assert (run.step_count, run.head_seq, run.reversible_count) == (3, 7, 3)
        assert [step.number for step in steps if step.run_id == run.pk] == [2, 3]
        assert services.verify_run(run=run).ok
