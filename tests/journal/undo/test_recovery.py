"""The recovery advice (MCP-Rescue's decision) as a pure table: one case per row, each decided by that row."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from journal.undo import outcomes, recovery
from journal.undo.recovery import Failure, Tool
from journal.upstream.failures import (
    MAX_RETRY_AFTER,
    classify_rpc_error,
    http_status_class,
    retry_after_seconds,
)

WRITE = Tool()  # neither read-only, idempotent nor reversible
READ = Tool(read_only=True)
IDEMPOTENT = Tool(idempotent=True)
REVERSIBLE = Tool(reversible=True)
ALLOWED = Tool(retries_allowed=True)

# One case per row of `recovery.RULES`: (row, failure, tool, action, retryable, retry after).
CASES = [
    ("denied by a policy or an approver", Failure("policy", held="denied"), WRITE, "stop", False, None),
    ("waiting for approval", Failure("policy", held="waiting"), WRITE, "backoff", True, 30),
    ("too many calls waiting for approval", Failure("policy", held="too_many"), WRITE, "backoff", True, 30),
    ("approval lapsed", Failure("policy", held="lapsed"), WRITE, "retry", True, None),
    ("the Recorder could not put the server's question to the agent",
     Failure("unknown", relay_failed="the agent's session had ended"), WRITE, "ask_user", False, None),
    (
        "answered too much to relay, and it only reads",
        Failure("unknown", may_have_acted=True, answered=True),
        READ,
        "repair_arguments",
        False,
        None,
    ),
    (
        "answered, but the answer reached no one",
        Failure("unknown", may_have_acted=True, answered=True),
        IDEMPOTENT,
        "ask_user",
        False,
        None,
    ),
    ("no answer, and it only reads", Failure("transient", may_have_acted=True), READ, "retry", True, None),
    (
        "no answer, and it is idempotent",
        Failure("transient", may_have_acted=True),
        IDEMPOTENT,
        "retry",
        True,
        None,
    ),
    (
        "no answer, and a policy lets repeats through",
        Failure("unknown", may_have_acted=True),
        ALLOWED,
        "retry",
        True,
        None,
    ),
    (
        "no answer, and it can be undone",
        Failure("transient", may_have_acted=True),
        REVERSIBLE,
        "ask_user",
        False,
        None,
    ),
    (
        "no answer, and it cannot be undone",
        Failure("transient", may_have_acted=True),
        WRITE,
        "ask_user",
        False,
        None,
    ),
    ("it may have acted", Failure("permission", may_have_acted=True), WRITE, "ask_user", False, None),
    ("transient, nothing reached the server", Failure("transient"), WRITE, "backoff", True, 2),
    ("invalid arguments", Failure("invalid_arguments"), WRITE, "repair_arguments", False, None),
    ("not found", Failure("not_found"), READ, "repair_arguments", False, None),
    ("conflict", Failure("conflict"), REVERSIBLE, "repair_arguments", False, None),
    # Issue 24, 7: the agent cannot renew the Recorder's credentials at the server: who must is said.
    ("authentication", Failure("authentication"), WRITE, "ask_user", False, None),
    ("permission", Failure("permission"), WRITE, "ask_user", False, None),
    # Issue 24, 7: a server that does not do this on this protocol is no passing outage.
    ("not on this protocol", Failure("unsupported"), READ, "ask_user", False, None),
    ("business rule", Failure("business_rule"), WRITE, "stop", False, None),
    ("anything else", Failure("unknown"), READ, "ask_user", False, None),
]


def deciding_row(failure: Failure, tool: Tool) -> str:
    return next(rule.name for rule in recovery.RULES if rule.when(failure, tool))


def test_every_row_of_the_table_has_a_case():
    assert [case[0] for case in CASES] == [rule.name for rule in recovery.RULES]


@pytest.mark.parametrize(
    ("row", "failure", "tool", "action", "retryable", "after"), CASES, ids=[c[0] for c in CASES]
)
def test_each_row_decides_its_case(row, failure, tool, action, retryable, after):
    assert deciding_row(failure, tool) == row
    advice = recovery.advise(failure, tool)
    assert (advice.action, advice.retryable, advice.retry_after) == (action, retryable, after)
    assert advice.action in recovery.ACTIONS and advice.category == failure.category
    wire = advice.as_wire()
    assert set(wire) == {"category", "action", "retryable", "why"} | ({"retryAfter"} if after else set())
    assert wire["why"].endswith(".")


def test_a_timeout_on_a_read_is_retry_and_on_a_tool_that_cannot_be_taken_back_is_ask_the_user():
    timeout = Failure("transient", may_have_acted=True)
    assert recovery.advise(timeout, READ).action == "retry"
    advice = recovery.advise(timeout, WRITE)
    assert advice.action == "ask_user" and not advice.retryable and "may already have acted" in advice.why


def test_the_servers_retry_after_is_passed_on():
    assert recovery.advise(Failure("transient", retry_after=12.0), WRITE).retry_after == 12.0
    assert recovery.advise(Failure("policy", held="waiting", retry_after=5.0), WRITE).retry_after == 5.0


def test_an_unknown_category_is_read_as_unknown():
    advice = recovery.advise(Failure("martian"), WRITE)
    assert advice.category == "unknown" and advice.action == "ask_user"


@pytest.mark.parametrize(
    ("kind", "idempotent", "guarded"),
    [
        ("read_only", False, False),
        ("compensate", True, False),
        ("compensate", False, True),
        ("none", False, True),
        ("unknown", False, True),
        ("unknown", True, False),
    ],
)
def test_the_retry_guard_covers_tools_that_are_neither_read_only_nor_idempotent(kind, idempotent, guarded):
    assert recovery.needs_retry_guard(kind=kind, idempotent=idempotent) is guarded


def test_a_tools_traits_come_from_its_annotations_and_its_declaration():
    assert recovery.tool_of({"annotations": {"idempotentHint": True}}, kind="unknown") == IDEMPOTENT
    assert recovery.tool_of({"annotations": {"idempotentHint": "yes"}}, kind="compensate") == REVERSIBLE
    assert recovery.tool_of(None, kind="read_only") == READ
    assert recovery.tool_of({"annotations": []}, kind="none", retries_allowed=True) == ALLOWED


def test_retry_after_reads_seconds_and_http_dates_and_caps_them():
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds("999999") == MAX_RETRY_AFTER
    later = datetime.now(UTC) + timedelta(seconds=90)
    assert 80 <= retry_after_seconds(format_datetime(later, usegmt=True)) <= 90
    assert retry_after_seconds(format_datetime(datetime.now(UTC) - timedelta(days=1), usegmt=True)) == 0.0
    assert (
        retry_after_seconds("soon") is None
        and retry_after_seconds(None) is None
        and retry_after_seconds("") is None
    )


def test_a_servers_refusal_of_the_recorders_credentials_says_who_must_act():
    advice = recovery.advise(Failure("authentication"), WRITE)
    assert advice.action == "ask_user" and "an admin must" in advice.why


@pytest.mark.parametrize("text", [
    "Tool 'ask' is unavailable on this protocol version (2025-03-26)",
    "sampling is not supported by the client",
    "This request targets the tasks extension; the client did not declare it for this request.",
])
def test_a_servers_not_on_this_protocol_is_not_read_as_a_passing_outage(text):
    """Before, "unavailable" in the server's words read as transient: back off and retry, forever in vain."""
    result = {"isError": True, "content": [{"type": "text", "text": text}]}
    assert outcomes.classify_tool_error(result) == "unsupported"
    assert recovery.advise(Failure(outcomes.classify_tool_error(result)), READ).action == "ask_user"
    assert outcomes.classify_tool_error({"isError": True, "content": [
        {"type": "text", "text": "The service is temporarily unavailable"}]}) == "transient"


@pytest.mark.parametrize(("status", "code", "expected"), [
    (501, None, "unsupported"), (505, None, "unsupported"), (503, None, "transient"),
    (None, -32022, "unsupported"), (None, -32021, "unsupported")])
def test_a_server_refusing_the_protocol_or_a_capability_is_not_transient(status, code, expected):
    if status is not None:
        assert http_status_class(status) == (expected, expected == "transient")
    else:
        assert classify_rpc_error(code) == expected
