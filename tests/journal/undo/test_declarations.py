"""Three dialects in, one model out: the declaration table, precedence, and hostile declarations."""

from datetime import UTC, datetime, timedelta

import pytest

from journal.undo.declarations import normalise, parse_call_journal, parse_duration

HATP_CATALOGUE = {"update_deal", "hatp_check", "hatp_compensate"}
SEP_RECOVERY = {"strategy": "compensation", "compensatingOperation": {
    "operationId": "refund_payment", "parameters": {"transactionId": "$response.body#/transactionId"}}}
CHRONO = {"reversibility": "compensable", "compensation": {
    "toolName": "release_inventory", "parameterMapping": {"id": "$.output.structuredContent.id"}}}


def hatp_tool(undo):
    return {"name": "update_deal", "_meta": {"hatp/journal": {"undo": undo}}}


@pytest.mark.parametrize(
    ("tool", "catalogue", "call", "kind", "source"),
    [
        # HATP, tool level
        (
            hatp_tool({"kind": "compensate", "window": "P7D", "via": "api"}),
            HATP_CATALOGUE,
            None,
            "compensate",
            "hatp/journal (tool)",
        ),
        (
            hatp_tool({"kind": "none", "reason": "delivered", "remedy": "send a correction"}),
            set(),
            None,
            "none",
            "hatp/journal (tool)",
        ),
        (hatp_tool({"kind": "unknown"}), set(), None, "unknown", "hatp/journal (tool)"),
        # HATP, call level wins over tool level
        (
            hatp_tool({"kind": "compensate", "window": "P7D"}),
            HATP_CATALOGUE,
            {"undo": {"kind": "none"}},
            "none",
            "hatp/journal (call)",
        ),
        # SEP-3172
        (
            {"name": "charge_payment", "annotations": {"recovery": SEP_RECOVERY}},
            {"charge_payment", "refund_payment"},
            None,
            "compensate",
            "annotations.recovery",
        ),
        # mcp-compensate
        (
            {"name": "reserve", "_meta": {"dev.chronomcp/compensate": CHRONO}},
            {"reserve", "release_inventory"},
            None,
            "compensate",
            "dev.chronomcp/compensate",
        ),
        (
            {"name": "stock", "_meta": {"dev.chronomcp/compensate": {"reversibility": "readonly"}}},
            set(),
            None,
            "read_only",
            "dev.chronomcp/compensate",
        ),
        (
            {
                "name": "ship",
                "_meta": {"dev.chronomcp/compensate": {"reversibility": "irreversible", "notes": "shipped"}},
            },
            set(),
            None,
            "none",
            "dev.chronomcp/compensate",
        ),
        # precedence: hatp tool > chronomcp > sep3172 > readOnlyHint
        (
            {
                "name": "x",
                "_meta": {"hatp/journal": {"undo": {"kind": "none"}}, "dev.chronomcp/compensate": CHRONO},
                "annotations": {"recovery": SEP_RECOVERY},
            },
            {"x", "release_inventory", "refund_payment"},
            None,
            "none",
            "hatp/journal (tool)",
        ),
        (
            {
                "name": "x",
                "_meta": {"dev.chronomcp/compensate": {"reversibility": "irreversible"}},
                "annotations": {"recovery": SEP_RECOVERY, "readOnlyHint": True},
            },
            {"x", "refund_payment"},
            None,
            "none",
            "dev.chronomcp/compensate",
        ),
        (
            {"name": "x", "annotations": {"recovery": SEP_RECOVERY, "readOnlyHint": True}},
            {"x", "refund_payment"},
            None,
            "compensate",
            "annotations.recovery",
        ),
        # readOnlyHint alone, and nothing at all
        (
            {"name": "get", "annotations": {"readOnlyHint": True}},
            set(),
            None,
            "read_only",
            "annotations.readOnlyHint",
        ),
        ({"name": "get", "annotations": {"readOnlyHint": False}}, set(), None, "unknown", "none"),
        ({"name": "legacy"}, set(), None, "unknown", "none"),
    ],
)
def test_declaration_table(tool, catalogue, call, kind, source):
    declaration = normalise(tool, catalogue=catalogue, call_journal=call)
    assert (declaration.kind, declaration.source) == (kind, source)


def test_call_level_fields_fill_in_from_the_tool_level():
    tool = hatp_tool(
        {"kind": "compensate", "window": "P30D", "sideEffect": "attendees get a cancellation notice"}
    )
    declaration = normalise(tool, catalogue=HATP_CATALOGUE, call_journal={"undo": {
        "kind": "compensate", "undoBy": "2026-12-29T10:00:00Z"}})
    assert declaration.side_effect == "attendees get a cancellation notice"
    assert declaration.undo_by == "2026-12-29T10:00:00Z"
    assert declaration.compensation.tool == "hatp_compensate"


def test_deadline_is_the_call_undo_by_or_completion_plus_window():
    done = datetime(2026, 11, 29, 10, tzinfo=UTC)
    by_window = normalise(hatp_tool({"kind": "compensate", "window": "P7D"}), catalogue=HATP_CATALOGUE)
    assert by_window.deadline(done) == done + timedelta(days=7)
    by_call = normalise(hatp_tool({"kind": "compensate", "window": "P7D"}), catalogue=HATP_CATALOGUE,
                        call_journal={"undo": {"kind": "compensate", "undoBy": "2026-12-01T00:00:00+00:00"}})
    assert by_call.deadline(done) == datetime(2026, 12, 1, tzinfo=UTC)


# -- hostile and wrong declarations ---------------------------------------------------------------------


def test_a_compensation_on_another_server_is_not_trusted():
    tool = {
        "name": "charge",
        "annotations": {
            "recovery": {
                "strategy": "compensation",
                "compensatingOperation": {"operationId": "bank__refund_everything", "parameters": {}},
            }
        },
    }
    declaration = normalise(tool, catalogue={"charge"})
    assert declaration.kind == "unknown"
    assert "not a tool of this server" in declaration.problems[0]


def test_a_chronomcp_compensation_naming_a_missing_tool_is_unknown():
    declaration = normalise({"name": "r", "_meta": {"dev.chronomcp/compensate": CHRONO}}, catalogue={"r"})
    assert declaration.kind == "unknown"


def test_the_undo_contracts_own_tools_cannot_be_named_as_a_compensation():
    tool = {"name": "c", "annotations": {"recovery": {"strategy": "compensation", "compensatingOperation": {
        "operationId": "hatp_compensate", "parameters": {}}}}}
    assert normalise(tool, catalogue={"c", "hatp_compensate"}).kind == "unknown"


def test_an_unknown_strategy_is_unknown_and_says_why():
    tool = {"name": "c", "annotations": {"recovery": {"strategy": "time-travel"}}}
    declaration = normalise(tool, catalogue={"c"})
    assert declaration.kind == "unknown"
    assert "time-travel" in declaration.problems[0]


@pytest.mark.parametrize(
    "undo",
    [
        {"kind": "maybe"},
        {"kind": "compensate", "window": 7},
        {"kind": "compensate", "window": "P1M"},
        {"kind": "compensate", "window": "seven days"},
        {"kind": "compensate", "cost": {"amount": "-5", "currency": "USD"}},
        {"kind": "compensate", "cost": {"amount": "2.50", "currency": "dollars"}},
        {"kind": "compensate", "via": "carrier pigeon"},
        {"kind": "none", "reason": "x" * 5000},
        {"kind": "compensate", "undoBy": "next tuesday"},
        {"kind": "compensate", "undoBy": "2026-12-01T00:00:00"},
        "compensate",
        ["compensate"],
    ],
)
def test_malformed_hatp_declarations_are_unknown_never_a_fallthrough(undo):
    # A SEP-3172 declaration below would say "compensate"; a broken HATP one above it must not fall through.
    tool = {"name": "t", "_meta": {"hatp/journal": {"undo": undo}}, "annotations": {"recovery": SEP_RECOVERY}}
    declaration = normalise(tool, catalogue={"t", "hatp_compensate", "refund_payment"})
    assert declaration.kind == "unknown"
    assert declaration.problems


@pytest.mark.parametrize(
    "chrono",
    [
        {"reversibility": "compensable"},
        {
            "reversibility": "compensable",
            "compensation": {"toolName": "release_inventory", "parameterMapping": [1]},
        },
        {"reversibility": "compensable", "compensation": {"toolName": 5, "parameterMapping": {}}},
        {"reversibility": "sometimes"},
        None,
    ],
)
def test_malformed_chronomcp_declarations_are_unknown(chrono):
    tool = {"name": "r", "_meta": {"dev.chronomcp/compensate": chrono}}
    declaration = normalise(tool, catalogue={"r", "release_inventory"})
    assert declaration.kind == "unknown"
    assert declaration.problems


@pytest.mark.parametrize(
    "recovery",
    [
        "compensation",
        {"strategy": "compensation"},
        {"strategy": "compensation", "compensatingOperation": {"operationId": ["refund_payment"]}},
        {
            "strategy": "compensation",
            "compensatingOperation": {"operationId": "refund_payment", "parameters": "id"},
        },
    ],
)
def test_malformed_sep3172_declarations_are_unknown(recovery):
    tool = {"name": "c", "annotations": {"recovery": recovery}}
    assert normalise(tool, catalogue={"c", "refund_payment"}).kind == "unknown"


def test_hatp_compensate_without_the_compensate_tool_needs_a_human():
    declaration = normalise(hatp_tool({"kind": "compensate"}), catalogue={"update_deal"})
    assert declaration.kind == "compensate"
    assert declaration.compensation is None
    assert "hatp_compensate" in declaration.problems[0]


def test_undo_through_the_ui_is_replayed_by_the_server_behind_hatp_compensate():
    declaration = normalise(hatp_tool({"kind": "compensate", "via": "ui"}), catalogue=HATP_CATALOGUE)
    assert declaration.via == "ui" and declaration.compensation.tool == "hatp_compensate"
    assert declaration.compensation.dialect == "hatp" and not declaration.problems
    manual = normalise(hatp_tool({"kind": "compensate", "via": "ui"}), catalogue={"update_deal"})
    assert manual.compensation is None and "to replay it through its screens" in manual.problems[0]


@pytest.mark.parametrize("fingerprint", [
    {"screen": "Records › C-77", "fields": {"x": "y" * 600}},
    {"screen": "s", "fields": {"x": {"nested": 1}}},
    {"screen": "s" * 300, "fields": {}},
    {"fields": {"x": "y"}},
])
def test_a_fingerprint_that_cannot_be_shown_is_refused(fingerprint):
    parsed, problems = parse_call_journal({"effect": {"version": "fp:1", "fingerprint": fingerprint}})
    assert parsed is None and any("fingerprint" in problem for problem in problems)


def test_a_malformed_call_journal_is_reported_not_trusted():
    parsed, problems = parse_call_journal({"effect": {"version": ["v1"]}, "receipt": {"alg": "RSA"}})
    assert parsed is None
    assert any("effect.version" in problem for problem in problems)


def test_integer_versions_are_kept_as_strings():
    parsed, problems = parse_call_journal({"effect": {"version": 13}})
    assert problems == [] and parsed.effect.version == "13"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("P7D", timedelta(days=7)),
        ("PT12H", timedelta(hours=12)),
        ("P2W", timedelta(weeks=2)),
        ("P1DT2H30M", timedelta(days=1, hours=2, minutes=30)),
    ],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["P", "PT", "P1Y", "P1M", "7D", "P1DT", "", "P-1D"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def _hinted(**annotations):
    return normalise({"name": "drop_table", "annotations": annotations}, catalogue={"drop_table"})


def test_sep2793_reversibility_is_a_hint_below_the_three_dialects():
    """Issue 24, 10: SEP-2793's tool risk metadata, read like readOnlyHint, shown with its source."""
    none = _hinted(reversibility="none", sideEffects=["drops the table", 7], riskLevel="critical",
                   approvalRecommendation="multi")
    assert (none.kind, none.source) == ("none", "annotations.reversibility")
    assert none.reason == ("Its server hints reversibility: none (SEP-2793); risk level critical, approval "
                           "recommended: multi: it cannot be undone for you.")
    assert none.side_effect == "drops the table"
    manual = _hinted(reversibility="manual")
    assert manual.kind == "none" and "by hand" in manual.remedy
    auto = _hinted(reversibility="auto")  # reversible, says the server: but with what? Nothing is declared.
    assert auto.kind == "unknown" and auto.source == "annotations.reversibility"
    assert "declares no compensation to undo it with" in auto.problems[0]
    # Below readOnlyHint and below every dialect; a value it does not define is no hint at all.
    assert _hinted(reversibility="none", readOnlyHint=True).kind == "read_only"
    recovery = {"strategy": "compensate", "compensation": {"tool": "u", "parameterMapping": {}}}
    declared = normalise({"name": "t", "annotations": {"reversibility": "none", "recovery": recovery}},
                         catalogue={"t", "u"})
    assert declared.source == "annotations.recovery"
    assert _hinted(reversibility="sometimes").source == "none"
