"""Recovery advice and the retry guard, through the Recorder (MCP-Rescue): every failed call tells the agent
what to do about it, and a repeat of a call whose first attempt may already have acted is held for a human
unless the tool is read-only or idempotent, or a policy lets such repeats through. The tool server is the
sample one, made to act on a call and then never answer (`act_then_hang`)."""

import httpx2 as httpx
import pytest
from django.test import Client as WebClient

from approver import services, tasks
from approver.models import ActionRequest
from journal import services as journal_services
from journal.models import ChainEntry, Step
from tests.journal.helpers import register_samples, run_agent

from .test_approvals import relying_party  # noqa: F401 - fixture
from .test_held_calls import decide, held, in_background, set_policy

TICKET = {"title": "Globex kickoff"}
pytestmark = pytest.mark.usefixtures("quick_timeout")  # before the Recorder starts


@pytest.fixture
def quick_timeout(settings):
    settings.TOOL_SERVER_TIMEOUT = 1  # read when the Recorder starts


@pytest.fixture
def bot(recorder, sample_servers, dana, monkeypatch):
    monkeypatch.setattr(tasks.notify_action_requested, "delay", lambda *args: None)
    register_samples(sample_servers, names=("crm", "payments", "legacy"))
    return journal_services.create_agent(name="sales-bot", on_behalf_of=dana)


def call(recorder, token, name, arguments):
    async def script(client):
        result = await client.call_tool(name, arguments)
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    return run_agent(recorder, token, script)


def advice(result) -> dict:
    return result["_meta"]["hatp/journal"]["recovery"]


def tickets(sample_servers) -> list:
    return [e for e in sample_servers.ledger("legacy") if e["op"] == "create_ticket"]


def lost_answer(recorder, token, sample_servers, server, name, arguments):
    """The server acts on the call and never answers: the Recorder gives up after its timeout."""
    sample_servers.set_mode(server, "act_then_hang")
    try:
        return call(recorder, token, name, arguments)
    finally:
        sample_servers.set_mode(server, "normal")


# -- advice ------------------------------------------------------------------------------------------------


def test_a_timeout_on_a_tool_that_cannot_be_taken_back_advises_asking_the_user(recorder, bot, sample_servers,
                                                                               on_call):
    _, token = bot
    result = lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    assert result["isError"] and "did not answer in time" in result["content"][0]["text"]
    assert advice(result)["action"] == "ask_user" and advice(result)["category"] == "transient"
    assert advice(result)["retryable"] is False and "may already have acted" in advice(result)["why"]
    assert len(tickets(sample_servers)) == 1  # it did act
    step = Step.objects.get()
    assert step.may_have_acted and step.recovery == advice(result)
    assert ChainEntry.objects.get(event="result").data["recovery"] == advice(result)
    page = WebClient()
    page.force_login(on_call)
    shown = page.get(f"/runs/{step.run.public_id}/").content.decode()
    assert "The agent was advised: <strong>ask a person</strong>" in shown


@pytest.mark.parametrize(("server", "tool", "arguments"), [
    ("legacy", "legacy__blob", {"size": 3}),  # readOnlyHint
    ("payments", "payments__refund_payment", {"transactionId": "txn_nope"}),  # idempotentHint
])
def test_a_timeout_on_a_read_or_an_idempotent_tool_advises_retrying(
    recorder, bot, sample_servers, server, tool, arguments
):
    _, token = bot
    result = lost_answer(recorder, token, sample_servers, server, tool, arguments)
    assert advice(result)["action"] == "retry" and advice(result)["retryable"] is True


def test_a_servers_own_tool_error_arrives_as_sent_with_advice_added(recorder, bot, sample_servers):
    _, token = bot
    result = call(recorder, token, "crm__update_deal", {"deal_id": "D-404", "stage": "Won"})
    assert (
        result["content"][0]["text"] == "Deal D-404 not found."
        and result["structuredContent"]["code"] == "NOT_FOUND"
    )
    assert advice(result) == {**advice(result), "category": "not_found", "action": "repair_arguments",
                              "retryable": False}
    assert Step.objects.get().recovery == advice(result)


def test_an_upstream_json_rpc_error_stays_verbatim_and_its_advice_is_journaled(recorder, bot, sample_servers):
    _, token = bot
    sample_servers.set_mode("legacy", "rpc_error")

    async def script(client):
        from mcp import MCPError

        with pytest.raises(MCPError) as raised:
            await client.call_tool("legacy__echo", {"a": 1})
        return raised.value.error

    error = run_agent(recorder, token, script)
    assert (error.code, error.message, error.data) == (
        -32602, "Invalid params for echo", {"field": "arguments", "tool": "echo"})
    assert Step.objects.get().recovery["action"] == "repair_arguments"


def test_the_recorders_own_errors_carry_advice(recorder, bot, sample_servers, admin_user):
    _, token = bot
    unknown = call(recorder, token, "nowhere__thing", {})
    assert advice(unknown)["action"] == "repair_arguments"
    set_policy(admin_user, unknown="deny")
    denied = call(recorder, token, "legacy__create_ticket", TICKET)
    assert advice(denied)["action"] == "stop" and advice(denied)["category"] == "policy"
    assert Step.objects.get(tool="create_ticket").recovery == advice(denied)
    deep = httpx.post(
        f"{recorder.base}/mcp/",
        headers={
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        },
        content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
        + b"[" * 80
        + b"]" * 80
        + b"}",
    )
    data = deep.json()["error"]["data"]
    assert (
        data["source"] == "recorder"
        and data["_meta"]["hatp/journal"]["recovery"]["action"] == "repair_arguments"
    )


# -- the retry guard ---------------------------------------------------------------------------------------


@pytest.mark.postgres  # on PostgreSQL through the one statement, which leaves a repeat to the guard
def test_a_repeat_after_an_unknown_outcome_is_held_and_runs_once_approved(
    recorder, bot, sample_servers, admin_user, approver_user
):
    _, token = bot
    set_policy(
        admin_user, ask_timeout=2, unknown="allow"
    )  # such calls are allowed: the guard still holds a repeat
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    repeat = call(recorder, token, "legacy__create_ticket", TICKET)
    assert repeat["isError"] and "may already have acted" in repeat["content"][0]["text"]
    assert advice(repeat)["action"] == "backoff"
    assert len(tickets(sample_servers)) == 1  # the repeat was not sent
    action = ActionRequest.objects.get()
    assert action.why["retryOf"]["step"] == 1 and action.why["retryOf"]["status"] == "error"
    first = Step.objects.get(number=1)
    assert Step.objects.get(number=2).policy_decision["retryOf"]["run"] == str(first.run.public_id)

    # The held-call page links the first attempt; an approver signs; the agent's next repeat goes through
    # once.
    page = WebClient()
    page.force_login(approver_user)
    shown = page.get(f"/actions/{action.public_id}/").content.decode()
    assert "the first attempt, step 1" in shown and "#step-1" in shown
    decide(action, approver_user, "approve")
    third = call(recorder, token, "legacy__create_ticket", TICKET)
    assert not third.get("isError") and len(tickets(sample_servers)) == 2

    # That repeat succeeded: the outcome is known again, so the next identical call is not held.
    fourth = call(recorder, token, "legacy__create_ticket", TICKET)
    assert not fourth.get("isError") and len(tickets(sample_servers)) == 3
    assert ActionRequest.objects.count() == 1


def test_an_argument_the_tool_does_not_declare_does_not_make_a_repeat_new(recorder, bot, sample_servers,
                                                                          admin_user):
    """Issue 22, finding 13: adding one argument the tool ignores slipped a repeat past the guard."""
    _, token = bot
    set_policy(admin_user, ask_timeout=1, unknown="allow")
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    repeat = call(recorder, token, "legacy__create_ticket", {**TICKET, "note": "ignored by the server"})
    assert repeat["isError"] and "may already have acted" in repeat["content"][0]["text"]
    assert len(tickets(sample_servers)) == 1 and ActionRequest.objects.count() == 1


@pytest.mark.postgres  # on PostgreSQL through the one statement, which leaves a repeat to the guard
def test_a_repeat_that_was_refused_does_not_hide_the_attempt_that_may_have_acted(
    recorder, bot, sample_servers, admin_user, approver_user
):
    _, token = bot
    set_policy(admin_user, ask_timeout=5, unknown="allow")
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    thread, box = in_background(lambda: call(recorder, token, "legacy__create_ticket", TICKET))
    decide(held(), approver_user, "reject", reason="check the first one by hand")
    thread.join(10)
    assert (
        "denied this call" in box["result"]["content"][0]["text"]
        and advice(box["result"])["action"] == "stop"
    )
    again = call(recorder, token, "legacy__create_ticket", TICKET)
    assert "may already have acted" in again["content"][0]["text"] and len(tickets(sample_servers)) == 1


def test_other_arguments_reads_and_idempotent_tools_are_not_held(recorder, bot, sample_servers, admin_user):
    _, token = bot
    set_policy(admin_user, ask_timeout=1, unknown="allow")
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    other = call(recorder, token, "legacy__create_ticket", {"title": "Another"})
    assert not other.get("isError")
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__blob", {"size": 2})
    assert not call(recorder, token, "legacy__blob", {"size": 2}).get("isError")
    lost_answer(
        recorder, token, sample_servers, "payments", "payments__refund_payment", {"transactionId": "t1"}
    )
    refund = call(recorder, token, "payments__refund_payment", {"transactionId": "t1"})
    assert refund["structuredContent"]["code"] == "NOT_FOUND"  # it reached the server
    assert not ActionRequest.objects.exists()


@pytest.mark.postgres  # on PostgreSQL through the one statement, which leaves a repeat to the guard
def test_a_policy_may_let_repeats_of_a_tool_through(recorder, bot, sample_servers, admin_user):
    _, token = bot
    row = set_policy(admin_user, ask_timeout=1, unknown="allow")
    row.allow_unknown_retries = True
    services.save_policy(row=row, by=admin_user)
    first = lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    assert advice(first)["action"] == "retry"  # the advice says what the policy allows
    repeat = call(recorder, token, "legacy__create_ticket", TICKET)
    assert (
        not repeat.get("isError") and len(tickets(sample_servers)) == 2 and not ActionRequest.objects.exists()
    )


@pytest.mark.postgres  # on PostgreSQL through the one statement, which leaves a repeat to the guard
def test_without_any_policy_the_guard_still_holds_a_repeat(recorder, bot, sample_servers, settings):
    _, token = bot
    lost_answer(recorder, token, sample_servers, "legacy", "legacy__create_ticket", TICKET)
    thread, box = in_background(lambda: call(recorder, token, "legacy__create_ticket", TICKET))
    action = held()
    assert "may already have acted" in action.reason and action.why["retryOf"]["step"] == 1
    services.expire_held_calls(now=action.expires_at)
    thread.join(15)
    assert box["result"]["isError"] and len(tickets(sample_servers)) == 1
