"""How a call is journaled, as pure functions (journal.record.journaling): no database, no clock, no
settings."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from journal.models import Run, Step
from journal.record import journaling
from journal.record.journaling import Outcome, Tool
from journal.upstream.bounded import Oversized

STARTED = datetime(2026, 12, 2, 3, 10, tzinfo=UTC)
FINISHED = STARTED + timedelta(milliseconds=42)
HATP = {"_meta": {"hatp/journal": {"undo": {"kind": "compensate"}}}}
UPDATE_DEAL = {"name": "update_deal", **HATP}
CRM = frozenset({"update_deal", "hatp_check", "hatp_compensate"})


def closed(outcome: Outcome, *, tool: Tool | None = None, inline_limit: int = 65536):
    return journaling.closed_fields(
        outcome=outcome,
        tool=tool or Tool(),
        arguments={"deal_id": "D-881"},
        started=STARTED,
        finished=FINISHED,
        inline_limit=inline_limit,
    )


def test_the_names_it_writes_are_the_models_own():
    assert {journaling.PENDING, journaling.HELD, journaling.OK, journaling.ERROR, journaling.UNDELIVERED,
            journaling.CANCELLED} <= set(Step.Status.values)
    assert {journaling.COMPENSATE, journaling.NONE, journaling.UNKNOWN, journaling.READ_ONLY} == set(
        Step.Reversibility.values)
    assert {journaling.INLINE, journaling.JOURNAL, journaling.DROPPED} == set(Step.ResultStorage.values)
    assert journaling.UNKNOWN_FAILURE in Step.FailureClass.values
    assert {"reversible_count", "irreversible_count", "unknown_count"} <= {f.name for f in Run._meta.fields}


def test_a_successful_answer_keeps_its_result_and_the_undo_facts_the_server_gave():
    result = {
        "content": [],
        "structuredContent": {"deal": {"id": "D-881"}},
        "_meta": {
            "hatp/journal": {
                "compensationToken": "ctk_1",
                "effect": {"summary": "Deal D-881 stage: Proposal → Won", "version": "v13"},
            }
        },
    }
    fields, journaled = closed(Outcome(result=result), tool=Tool(definition=UPDATE_DEAL,
                                                                 catalogue=CRM))
    assert journaled == result
    assert fields["status"] == "ok" and fields["is_error"] is False and fields["result"] == result
    assert fields["result_storage"] == "inline" and fields["duration_ms"] == pytest.approx(42)
    assert fields["reversibility"] == "compensate" and fields["compensation_arguments"] == {
        "compensationToken": "ctk_1"}
    assert fields["effect_version"] == "v13" and fields["undo_problems"] == []


def _deal_update(effect: dict) -> dict:
    return {"content": [], "_meta": {"hatp/journal": {"compensationToken": "ctk_1", "effect": {
        "summary": "Deal D-881 stage: Proposal → Won", "version": "v13", **effect}}}}


def test_the_changed_fields_values_a_server_gives_are_kept_with_the_effect():
    fields, _ = closed(Outcome(result=_deal_update({"before": {"stage": "Proposal", "amount": 48000},
                                                    "after": {"stage": "Won", "amount": 48000}})),
                       tool=Tool(definition=UPDATE_DEAL, catalogue=CRM))
    assert fields["effect_fields"] == {"before": {"stage": "Proposal", "amount": 48000},
                                       "after": {"stage": "Won", "amount": 48000}}
    assert fields["reversibility"] == "compensate"


@pytest.mark.parametrize("before", [{"stage": {"$gt": ""}}, ["Proposal"], "Proposal", {"": 1},
                                    {f"f{n}": n for n in range(41)}])
def test_field_values_that_cannot_be_shown_are_dropped_and_the_change_stays_undoable(before):
    fields, _ = closed(Outcome(result=_deal_update({"before": before, "after": {"stage": "Won"}})),
                       tool=Tool(definition=UPDATE_DEAL, catalogue=CRM))
    assert fields["effect_fields"] == {"before": None, "after": {"stage": "Won"}, "unreadable": True}
    assert fields["reversibility"] == "compensate" and fields["undo_problems"] == []
    assert fields["effect_version"] == "v13"


def test_a_large_result_is_kept_in_the_record_only_with_its_size_and_digest():
    result = {"content": [{"type": "text", "text": "x" * 200}]}
    fields, journaled = closed(Outcome(result=result), inline_limit=100)
    size, digest = journaling.measured(result)
    assert journaled == result and fields["result"] is None and fields["result_storage"] == "journal"
    assert (fields["result_size"], fields["result_sha256"]) == (size, digest)


def test_the_servers_tool_error_is_a_failed_step_classified_by_its_words():
    fields, _ = closed(
        Outcome(result={"isError": True, "content": [{"type": "text", "text": "Deal not found"}]})
    )
    assert (
        fields["status"] == "error" and fields["is_error"] is True and fields["failure_class"] == "not_found"
    )
    assert "reversibility" not in fields  # a failed call keeps the tool-level declaration


def test_an_answer_that_only_asked_for_more_input_did_nothing():
    fields, _ = closed(Outcome(result={"resultType": "input_required", "inputRequests": {}}),
                       tool=Tool(definition=UPDATE_DEAL, catalogue=CRM))
    assert fields["reversibility"] == "read_only" and fields["undo_problems"] == []
    assert fields["effect_summary"] == "The server asked for more input before acting."


def test_an_answer_the_agent_never_got_is_undelivered_and_may_have_acted():
    fields, _ = closed(Outcome(result={"content": []}, undelivered="the agent went away"))
    assert (fields["status"], fields["error_message"], fields["may_have_acted"]) == (
        "undelivered", "the agent went away", True)


def test_an_answer_over_the_limit_keeps_only_its_size_and_digest():
    fields, journaled = closed(Outcome(oversized=Oversized(size=40_000_000, sha256="ab" * 32, limit=32),
                                       undelivered="too large"))
    assert journaled is None and fields["status"] == "undelivered" and fields["result_storage"] == "dropped"
    assert (fields["result_size"], fields["reversibility"], fields["may_have_acted"]) == (
        40_000_000,
        "unknown",
        True,
    )
    assert "size limit" in fields["undo_problems"][0]


def test_a_call_cancelled_while_the_server_had_it_may_have_acted_and_one_cancelled_before_did_nothing():
    had_it, _ = closed(Outcome(cancelled="cancelled", may_have_acted=True))
    before, _ = closed(Outcome(cancelled="cancelled before it was sent"))
    assert (had_it["status"], had_it["reversibility"], had_it["may_have_acted"]) == (
        "cancelled",
        "unknown",
        True,
    )
    assert (before["status"], before["reversibility"], before["undo_problems"]) == (
        "cancelled",
        "read_only",
        [],
    )
    assert "may_have_acted" not in before


def test_no_answer_is_a_failure_that_may_have_acted_only_when_the_server_had_the_call():
    acted, _ = closed(Outcome(error_message="timed out", failure_class="transient", may_have_acted=True))
    refused, _ = closed(Outcome(error_message="connection refused"))
    assert (acted["status"], acted["failure_class"], acted["reversibility"]) == (
        "error",
        "transient",
        "unknown",
    )
    assert (refused["failure_class"], "reversibility" in refused) == ("unknown", False)


def test_the_advice_given_is_kept_as_i_json():
    fields, _ = closed(Outcome(error_message="x", recovery={"category": "transient", "action": "retry"}))
    assert fields["recovery"] == {"category": "transient", "action": "retry"}


@pytest.mark.parametrize(("status", "reversibility", "acted", "expected"), [
    ("ok", "compensate", True, (False, "reversible_count")),
    ("ok", "none", True, (False, "irreversible_count")),
    ("error", "unknown", True, (True, "unknown_count")),
    ("undelivered", "compensate", True, (True, "reversible_count")),
    ("error", "compensate", False, (True, None)),
    ("ok", "read_only", True, (False, None)),
])
def test_counters_count_failures_and_only_calls_that_acted(status, reversibility, acted, expected):
    assert journaling.counters(status=status, reversibility=reversibility, acted=acted) == expected


def test_a_call_acted_when_it_answered_without_error_or_may_have():
    assert journaling.acted(Outcome(result={}), is_error=False)
    assert not journaling.acted(Outcome(result={"isError": True}), is_error=True)
    assert journaling.acted(Outcome(may_have_acted=True), is_error=True)
    assert not journaling.acted(Outcome(error_message="refused"), is_error=True)


def test_the_intent_is_i_json_with_the_tools_declaration_and_a_digest_of_who_calls_what():
    call = journaling.prepared(
        arguments={"n": 1.0},
        request_meta={},
        tool_def=UPDATE_DEAL,
        catalogue={"update_deal"},
        agent="sales-bot",
        server_name="crm",
        tool="update_deal",
    )
    again = journaling.prepared(
        arguments={"n": 1.0},
        request_meta=None,
        tool_def=UPDATE_DEAL,
        catalogue={"update_deal"},
        agent="other-bot",
        server_name="crm",
        tool="update_deal",
    )
    assert call.request_meta is None and call.declaration.kind == "compensate" and call.guarded
    assert call.digest != again.digest  # the retry guard finds repeats of one agent's call only
    entry = journaling.call_entry(number=3, server_name="crm", tool="update_deal", call=call,
                                  who={"agent": "sales-bot"}, decision={"decision": "allow"})
    assert entry == {"step": 3, "server": "crm", "tool": "update_deal", "arguments": call.arguments,
                     "agent": "sales-bot", "policy": {"decision": "allow"}}


def test_only_a_read_or_an_idempotent_tool_may_be_repeated_blindly():
    call = journaling.prepared(
        arguments={},
        request_meta={"k": "v"},
        tool_def={"name": "echo"},
        catalogue={"echo"},
        agent="a",
        server_name="legacy",
        tool="echo",
    )
    assert call.guarded and call.request_meta == {"k": "v"}
    for annotations in ({"readOnlyHint": True}, {"idempotentHint": True}):
        assert not journaling.prepared(arguments={}, request_meta=None, catalogue={"get"}, agent="a",
                                       tool_def={"name": "get", "annotations": annotations}, server_name="s",
                                       tool="get").guarded
    assert journaling.call_entry(number=1, server_name="legacy", tool="echo", call=call, who={},
                                 decision=None)["meta"] == {"k": "v"}


def test_a_call_the_policy_asks_about_opens_held_and_a_halted_run_denies_naming_the_plan():
    assert journaling.opening_status({"decision": "ask"}) == "held"
    assert journaling.opening_status({"decision": "allow"}) == journaling.opening_status(None) == "pending"
    assert journaling.halted_decision(
        {"decision": "allow", "class": "reversible"}, why="stopped", plan="p1"
    ) == {"decision": "deny", "class": "reversible", "reason": "stopped", "haltedBy": "p1"}


def test_the_result_entry_says_what_the_record_covers():
    step = SimpleNamespace(
        number=2, status="ok", is_error=False, result_size=10, result_sha256="ab", error_message="",
        failure_class="", duration_ms=1.23456, reversibility="compensate", declaration_source="hatp_call",
        compensation_arguments={"compensationToken": "t"}, undo_problems=[], undo_by=STARTED,
        effect_summary="Deal won", effect_resource="crm://deal", effect_version="v1", receipt_verified=True)
    entry = journaling.result_entry(step, result={"content": []}, outcome=Outcome(result={"content": []}),
                                    recovery=None, links=[{"step": 1, "rule": "inferred"}])
    assert entry["durationMs"] == 1.235 and entry["undo"]["undoBy"] == "2026-12-02T03:10:00.000000Z"
    assert entry["effect"] == {"summary": "Deal won", "resource": "crm://deal", "version": "v1"}
    assert entry["dependsOn"] == [{"step": 1, "rule": "inferred"}] and "recovery" not in entry
    assert entry["resultSize"] == 10 and "resultDropped" not in entry and entry["error"] is None


def test_an_imported_records_field_values_are_read_as_a_servers_are():
    from journal.undo.fields import field_change

    kept = field_change({"stage": "Proposal"}, {"stage": "Won"})
    assert field_change(kept["before"], kept["after"]) == kept
    assert field_change(None, {"stage": "Won"}, unreadable=True) == {
        "before": None, "after": {"stage": "Won"}, "unreadable": True}
    assert field_change(None, None) is None
