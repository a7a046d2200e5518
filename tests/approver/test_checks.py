"""Reading tool servers' answers to a check: the contract, and answers from servers that lie."""

from datetime import UTC, datetime

import pytest

from approver import checks
from journal.upstream.client import Endpoint

TARGET = checks.CheckTarget(
    item_id=1, endpoint=Endpoint(name="payments", transport="http", url="http://127.0.0.1:9/payments/mcp"),
    dialect="sep3172", tool="refund_payment", arguments={"transactionId": "tx_1"}, if_version="",
    idempotency_key="undo-p-1", undo_by=datetime(2030, 1, 1, tzinfo=UTC),
)
REFUND = {"name": "refund_payment", "inputSchema": {
    "type": "object", "properties": {"transactionId": {"type": "string"}}, "required": ["transactionId"],
    "additionalProperties": False}}


def test_hatp_ok_keeps_the_servers_words_for_the_undo():
    result = checks.read_hatp_answer(
        {
            "content": [{"type": "text", "text": "Undo would work now."}],
            "structuredContent": {"ok": True, "wouldDo": "Deal D-881 stage: Won → Proposal"},
        }
    )
    assert result == checks.CheckResult("ok", {"wouldDo": "Deal D-881 stage: Won → Proposal"})


def test_hatp_conflict_keeps_the_current_version_and_who_changed_it():
    result = checks.read_hatp_answer({"isError": True, "content": [{"type": "text", "text": "changed"}],
                                      "structuredContent": {"code": "UNDO_CONFLICT", "current": {
                                          "version": "v14", "summary": "Deal D-881 amount: 40000 → 45000",
                                          "changedBy": "priya", "changedAt": "2026-11-29T10:00:00Z"}}})
    assert result.status == "conflict"
    assert result.detail["current"] == {"version": "v14", "summary": "Deal D-881 amount: 40000 → 45000",
                                        "changedBy": "priya", "changedAt": "2026-11-29T10:00:00Z"}


@pytest.mark.parametrize(("code", "status", "failure_class"), [
    ("UNDO_EXPIRED", "expired", None),
    ("UNDO_UNKNOWN_TOKEN", "error", "not_found"),
    ("UNDO_FAILED", "error", "business_rule"),
    ("SOMETHING_ELSE", "error", "business_rule"),  # an isError answer with no known code: the server said no
])
def test_hatp_refusals_map_to_check_results(code, status, failure_class):
    result = checks.read_hatp_answer({"isError": True, "content": [{"type": "text", "text": "no"}],
                                      "structuredContent": {"code": code}})
    assert result.status == status
    assert result.detail.get("failureClass") == failure_class


def test_a_lying_server_gets_only_bounded_strings_through():
    result = checks.read_hatp_answer({"isError": True, "content": [{"type": "text", "text": "x" * 10_000}],
                                      "structuredContent": {"code": "UNDO_CONFLICT", "current": {
                                          "version": {"$gt": ""}, "summary": ["<script>"], "changedBy": 42,
                                          "changedAt": "y" * 10_000, "extra": "dropped"}}})
    assert result.status == "conflict"
    assert result.detail["current"] == {"version": "", "summary": "", "changedBy": "", "changedAt": "y" * 500}
    assert len(result.detail["message"]) == 500
    # A result that is not even shaped like one is an error, not a pass.
    assert checks.read_hatp_answer({"isError": True, "structuredContent": "nonsense"}).status == "error"


def test_sep3172_check_passes_when_the_tool_is_listed_and_accepts_the_arguments():
    assert checks.read_catalogue([REFUND], TARGET).status == "ok"


def test_a_compensating_tool_gone_from_the_catalogue_is_unavailable():
    result = checks.read_catalogue([{"name": "charge_payment", "inputSchema": {"type": "object"}}], TARGET)
    assert result.status == "unavailable" and "no longer lists refund_payment" in result.detail["message"]


def test_arguments_the_schema_refuses_are_an_invalid_arguments_error():
    target = checks.CheckTarget(**{**TARGET.__dict__, "arguments": {"transactionId": 7}})
    result = checks.read_catalogue([REFUND], target)
    assert result.status == "error" and result.detail["failureClass"] == "invalid_arguments"
    assert "would refuse the arguments" in result.detail["message"]


@pytest.mark.parametrize("schema", [None, "object", {"type": "no-such-type"}, {"properties": "nope"}])
def test_a_hostile_or_broken_schema_is_an_error_not_a_crash(schema):
    result = checks.read_catalogue([{"name": "refund_payment", "inputSchema": schema}], TARGET)
    assert result.status == "error" and result.detail["failureClass"] == "invalid_arguments"


def _conflict(current):
    return {"isError": True, "content": [{"type": "text", "text": "changed"}],
            "structuredContent": {"code": "UNDO_CONFLICT", "current": current}}


PRIYA = {"version": "v14", "summary": "Deal D-881 amount: 48000 → 45000", "changedBy": "priya",
         "changedAt": "2026-11-29T10:12:00Z"}
EFFECT = {"before": {"stage": "Proposal", "amount": "48000", "owner": "dana"},
          "after": {"stage": "Won", "amount": "48000", "owner": "dana"}}


def test_a_conflict_with_field_values_is_shown_three_ways_field_by_field():
    now = {"stage": "Won", "amount": "45000", "owner": "dana", "close_date": "2026-12-15"}
    result = checks.read_hatp_answer(_conflict({**PRIYA, "fields": now}), EFFECT)
    assert result.detail["current"]["fields"] == now
    # Only what differs, of the fields the agent's effect names: the agent's stage, priya's amount.
    assert result.detail["threeWay"] == {"fields": [
        {"field": "amount", "before": "48000", "left": "48000", "now": "45000"},
        {"field": "stage", "before": "Proposal", "left": "Won", "now": "Won"},
    ]}
    assert "fieldsGiven" not in result.detail


def test_a_conflict_without_field_values_keeps_what_the_server_gave_and_says_it_gave_none():
    result = checks.read_hatp_answer(_conflict(PRIYA), EFFECT)
    assert result.detail["current"] == PRIYA and result.detail["fieldsGiven"] is False
    assert "threeWay" not in result.detail


def test_field_values_now_without_the_agents_are_shown_beside_what_is_not_known():
    result = checks.read_hatp_answer(_conflict({**PRIYA, "fields": {"amount": 45000}}), None)
    assert result.detail["threeWay"] == {"fields": [
        {"field": "amount", "before": "(not given)", "left": "(not given)", "now": "45000"}]}


@pytest.mark.parametrize("fields", [
    {"nested": {"a": 1}}, [1, 2], "all of them", {f"f{n}": n for n in range(41)}, {"": 1}, {"x": [1]},
])
def test_field_values_that_cannot_be_shown_are_dropped_and_said_to_be(fields):
    result = checks.read_hatp_answer(_conflict({**PRIYA, "fields": fields}), EFFECT)
    assert result.status == "conflict" and result.detail["current"]["fieldsUnreadable"] is True
    assert "fields" not in result.detail["current"] and "threeWay" not in result.detail
