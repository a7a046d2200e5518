"""Everything an agent controls in a call (its `_meta`, `hatp/journal`'s `runId`, `sagaStart`, `dependsOn`,
`idempotencyKey`, the arguments) is read safely: whatever shape it has, a call that reached a tool server
ends journaled with its outcome, and a step that cannot be closed never stops the reconciler for the rest.
(Issue 22, finding 1: `{"hatp/journal": ["x"]}` left the agent's change un-undoable and stalled the
reconciler for everyone.)"""

import json
import os
from datetime import timedelta

import httpx2
import pytest
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from journal import services
from journal.models import Agent, Run, Step
from journal.services import in_flight as step_services  # where the reconciler closes steps

from .helpers import post_stateless_call, register_samples, settle
from .test_task_calls import answer_of

pytestmark = pytest.mark.django_db(transaction=True)

# CI's size finishes in well under a minute; bench/agent_meta_fuzz.py runs it large.
EXAMPLES = int(os.environ.get("AGENT_META_EXAMPLES", "500"))


@pytest.fixture
def token(recorder, sample_servers, dana):
    register_samples(sample_servers, names=("crm", "legacy"))
    return services.create_agent(name="sales-bot", on_behalf_of=dana)[1]


def raw_call(recorder, token: str, name: str, arguments: dict, meta: dict, *, ok: bool = True) -> dict:
    """A tools/call on the stateless protocol with exactly the `_meta` given (as no SDK would send it): the
    JSON-RPC answer (`ok`: it must be an HTTP 200, else the status is in `httpStatus`)."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", **meta}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta}}
    response = post_stateless_call(recorder, token, name, json.dumps(body))
    settle(recorder)
    if ok:
        assert response.status_code == 200, response.text
    return {"httpStatus": response.status_code, **(response.json() if response.content else {})}


@pytest.mark.parametrize("journal", [
    ["x"], "x", 7, None, True,
    {"dependsOn": "x"}, {"dependsOn": {"step": 1}}, {"dependsOn": [True, "2", 1.5, -1, 99, None]},
    {"runId": 5}, {"runId": ["a"]}, {"sagaStart": "yes"}, {"idempotencyKey": {"k": 1}},
], ids=repr)
def test_an_agents_change_is_journaled_with_its_undo_whatever_hatp_journal_it_sent(recorder, token, journal):
    answer = raw_call(recorder, token, "crm__update_deal",
                      {"deal_id": "D-881", "stage": "Won"}, {"hatp/journal": journal})
    assert answer["result"].get("isError") is not True
    step = Step.objects.get()
    assert step.status == "ok" and step.compensation_arguments is not None  # so the change can be undone
    assert services.verify_run(run=step.run).ok


def test_an_agents_idempotency_key_is_its_own_never_another_agents_or_the_recorders(recorder, sample_servers,
                                                                                    dana):
    # Issue 22, finding 16: a server that honours idempotency keys answered the second agent's email with the
    # first one's outcome, and sent nothing, because both sent the same key (here, the shape of a key the
    # Recorder uses for an approved held call).
    register_samples(sample_servers, names=("mail",))
    agents = [services.create_agent(name=name, on_behalf_of=dana) for name in ("sales-bot", "support-bot")]
    for (_, token), to in zip(agents, ("buyer@globex.example", "cfo@initech.example"), strict=True):
        answer = raw_call(recorder, token, "mail__send_email", {"to": to, "subject": "Hi", "body": "Hello."},
                          {"hatp/journal": {"idempotencyKey": "held-call:0b5e7a1c"}})
        assert answer["result"].get("isError") is not True, answer
    sent = [entry for entry in sample_servers.ledger("mail") if entry["op"] == "send_email"]
    assert [(e["to"], e["idempotencyKey"]) for e in sent] == [
        ("buyer@globex.example", f"agent-{agents[0][0].pk}:held-call:0b5e7a1c"),
        ("cfo@initech.example", f"agent-{agents[1][0].pk}:held-call:0b5e7a1c"),
    ]
    # The record says what the server was sent.
    assert [s.request_meta["hatp/journal"]["idempotencyKey"] for s in Step.objects.order_by("id")] == [
        e["idempotencyKey"] for e in sent]


def test_the_reconciler_closes_every_stale_step_whatever_the_agent_sent(recorder, token):
    now = timezone.now()
    for journal in (["x"], {"dependsOn": [1]}):
        services.open_step(agent=_agent(), run_key="run:stale",
                           server=None, server_name="crm", tool="update_deal", arguments={"deal_id": "D-881"},
                           request_meta={"hatp/journal": journal}, now=now - timedelta(hours=1))
    assert services.reconcile_stale_steps(older_than=now) == 2
    assert set(Step.objects.values_list("status", flat=True)) == {"error"}


def test_one_step_that_cannot_be_closed_does_not_stop_the_reconciler_for_the_rest(recorder, token,
                                                                                   monkeypatch):
    now = timezone.now()
    for n in range(3):
        services.open_step(agent=_agent(), run_key=f"run:stale-{n}", server=None, server_name="crm",
                           tool="update_deal", arguments={"n": n}, request_meta=None,
                           now=now - timedelta(hours=1))
    first = Step.objects.order_by("id").first()
    close = step_services.close_step

    def breaks_on_the_first(*, opened, **kwargs):
        if opened.step_id == first.pk:
            raise RuntimeError("a row nobody can close")
        return close(opened=opened, **kwargs)

    monkeypatch.setattr(step_services, "close_step", breaks_on_the_first)
    assert services.reconcile_stale_steps(older_than=now) == 2
    assert list(Step.objects.order_by("id").values_list("status", flat=True)) == ["pending", "error", "error"]


def _agent() -> Agent:
    return Agent.objects.get(name="sales-bot")


# Texts with what a record may not keep (issue 43): U+0000, a lone surrogate (JSON's \ud800), and others.
_HOSTILE_TEXT = st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfffy", "\u2028", "\ufeff", "\x7f"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53 + 1, 2**53 - 1) | st.floats(allow_nan=False,
                                                                              allow_infinity=False)
    | st.text(max_size=12) | _HOSTILE_TEXT,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
_HATP = st.one_of(_JSON, st.dictionaries(
    st.sampled_from(["runId", "sagaStart", "dependsOn", "idempotencyKey", "recovery", "undoPlan", "other"]),
    st.one_of(_JSON, st.lists(st.integers(-3, 40), max_size=4), st.text(min_size=1, max_size=20)),
    max_size=5))
# A progress token of any shape, a megabyte's included (issue 43, finding 1), and the tasks extension
# declared, or something else under its key.
_PROGRESS = st.one_of(_JSON, st.just("p" * 1_000_000), st.integers())
_CAPABILITIES = st.one_of(_JSON, st.just({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
                          st.fixed_dictionaries({"extensions": _JSON}))
_META = st.dictionaries(st.sampled_from(["hatp/journal", "vendor/flag", "x"]), _HATP, max_size=3).flatmap(
    lambda meta: st.fixed_dictionaries({}, optional={
        "progressToken": _PROGRESS, "io.modelcontextprotocol/clientCapabilities": _CAPABILITIES}).map(
        lambda more: {**meta, **more}))
_CALL = st.one_of(
    st.tuples(st.just("crm__update_deal"), st.fixed_dictionaries(
        {"deal_id": st.sampled_from(["D-881", "D-1", ""])},
        optional={"stage": _JSON, "amount": _JSON, "extra": _JSON})),
    st.tuples(st.just("legacy__echo"),
              st.dictionaries(st.sampled_from(["text", "n", "x"]), _JSON, max_size=3)),
)


def test_every_call_an_agent_can_shape_that_reached_a_server_ends_journaled_with_its_outcome(recorder, token):
    seen = {"calls": 0, "journaled": 0, "refused before anything was journaled": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(call=_CALL, meta=_META)
    def one_call(call, meta):
        name, arguments = call
        before = Step.objects.count()
        answer = raw_call(recorder, token, name, arguments, meta, ok=False)
        seen["calls"] += 1
        if Step.objects.count() == before:  # refused: nothing journaled, so nothing was sent either
            assert answer["httpStatus"] != 200 or "error" in answer or answer["result"].get("isError"), answer
            seen["refused before anything was journaled"] += 1
            return
        step = Step.objects.order_by("-id").first()
        assert step.status not in ("pending", "held"), (meta, step.status)
        assert step.finished_at is not None and (step.result is not None or step.error_message)
        seen["journaled"] += 1

    one_call()
    assert services.reconcile_stale_steps(older_than=timezone.now()) == 0
    assert all(services.verify_run(run=run).ok for run in Run.objects.all())
    print(f"\nagent-controlled calls: {json.dumps(seen)}")


@pytest.mark.postgres  # where a U+0000 in a lookup is the database's error, unless refused before
@settings(max_examples=max(EXAMPLES // 5, 20), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(task_id=st.one_of(st.text(max_size=40), _HOSTILE_TEXT, st.just("crm__" + "t" * 10_000),
                         st.builds(lambda t: f"crm__{t}", st.text(max_size=20)), _JSON,
                         st.builds(lambda t: f"held:{t}", st.one_of(st.text(max_size=40), _HOSTILE_TEXT)),
                         st.just("held:00000000-0000-0000-0000-000000000000")))
@example(task_id="held:a\x00b")
@example(task_id="crm__a\x00b")
def test_a_task_handle_an_agent_makes_up_gets_a_clear_error_and_changes_nothing(recorder, token, task_id):
    """`tasks/get`, `tasks/update` and `tasks/cancel` with any handle an agent can send (a made-up one,
    another server's, U+0000, a lone surrogate, 10,000 characters, not a string at all): a JSON-RPC error
    that says so, never a server error, and nothing journaled."""
    before = Step.objects.count()
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {
                    "io.modelcontextprotocol/tasks": {}}}}
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"taskId": task_id, "_meta": meta}}
        response = _post(recorder, token, method, body)
        assert response.status_code < 500, response.text
        answer = answer_of(response)
        assert "error" in answer and answer["error"]["code"] in (-32700, -32600, -32602, -32601), (
            response.status_code, response.headers, answer)
    assert Step.objects.count() == before


def _post(recorder, token: str, method: str, body: dict):
    """`body` as written (its task handle may be no string at all, so no Mcp-Name header)."""
    return httpx2.post(f"{recorder.base}/mcp/", content=json.dumps(body).encode(), timeout=30, headers={
        "authorization": f"Bearer {token}", "content-type": "application/json",
        "accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
        "mcp-method": method})
