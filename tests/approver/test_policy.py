"""Autonomy policies as pure decisions: classes of call, scope precedence, every decision, the simulator."""

import pytest

from approver import policy
from approver.policy import Policy

ALL_ASK = dict.fromkeys(policy.CLASSES, "ask")


def everything(**decisions) -> Policy:
    return Policy(
        id=1, name="Default", scope="everything", decisions={**policy.DEFAULT_DECISIONS, **decisions}
    )


@pytest.mark.parametrize(("kind", "via", "dialect", "expected"), [
    ("compensate", "api", "hatp", "compensate_api"),
    ("compensate", None, "hatp", "compensate_api"),
    ("compensate", "ui", "hatp", "compensate_ui"),
    ("compensate", "api", "sep3172", "compensate_no_version"),
    ("compensate", "api", "chronomcp", "compensate_no_version"),
    ("none", None, None, "none"),
    ("unknown", None, None, "unknown"),
    ("read_only", None, None, "read"),
])
def test_a_call_is_classed_by_what_its_server_declares(kind, via, dialect, expected):
    assert policy.call_class(kind=kind, via=via, dialect=dialect) == expected


def test_the_most_specific_policy_wins():
    policies = [
        everything(),
        Policy(id=2, name="sales-bot", scope="agent", agent="sales-bot", decisions=ALL_ASK),
        Policy(
            id=3, name="crm", scope="server", server="crm", decisions={**ALL_ASK, "compensate_api": "deny"}
        ),
        Policy(
            id=4,
            name="deals",
            scope="tool",
            server="crm",
            tool="update_deal",
            decisions={**ALL_ASK, "compensate_api": "allow"},
        ),
    ]
    call = {"agent": "sales-bot", "kind": "compensate", "via": "api", "dialect": "hatp"}
    assert policy.decide(policies, server="crm", tool="update_deal", **call).policy.id == 4
    assert policy.decide(policies, server="crm", tool="get_deal", **call).policy.id == 3
    assert policy.decide(policies, server="calendar", tool="create_event", **call).policy.id == 2
    other = {**call, "agent": "ops-bot"}
    assert policy.decide(policies, server="calendar", tool="create_event", **other).policy.id == 1
    # A policy for another tool of the same name on another server does not match.
    assert policy.decide(policies, server="calendar", tool="update_deal", **other).policy.id == 1


@pytest.mark.parametrize("decision", policy.DECISIONS)
@pytest.mark.parametrize("klass", policy.CLASSES)
def test_every_decision_for_every_class(decision, klass):
    kind, via, dialect = {
        "compensate_api": ("compensate", "api", "hatp"), "compensate_ui": ("compensate", "ui", "hatp"),
        "compensate_no_version": ("compensate", "api", "sep3172"), "none": ("none", None, None),
        "unknown": ("unknown", None, None)}[klass]
    decided = policy.decide([everything(**{klass: decision})], agent="a", server="s", tool="t",
                            kind=kind, via=via, dialect=dialect)
    assert (decided.decision, decided.call_class) == (decision, klass)
    assert "policy “Default” (every call)" in decided.reason and decided.reason.startswith("s__t ")


def test_the_reason_says_why_a_call_cannot_be_undone():
    decided = policy.decide([everything()], agent="sales-bot", server="mail", tool="send_email", kind="none",
                            reason="delivered to external recipients", remedy="send a correction email",
                            source="hatp/journal (tool)")
    assert decided.decision == "ask"
    assert decided.reason == ("mail__send_email cannot be undone (delivered to external recipients): "
                              "a human must approve it first by policy “Default” (every call).")
    assert decided.why == {"reason": "delivered to external recipients", "remedy": "send a correction email",
                           "source": "hatp/journal (tool)"}
    assert decided.as_record()["policy"] == {"id": 1, "name": "Default", "scope": "every call"}


def test_reads_are_always_allowed_and_without_any_policy_calls_are_allowed():
    assert policy.decide([everything(unknown="deny")], agent="a", server="crm", tool="get_deal",
                         kind="read_only").decision == "allow"
    unknown = policy.decide([], agent="a", server="legacy", tool="purge", kind="unknown")
    assert unknown.decision == "allow" and unknown.policy is None
    assert unknown.reason == "legacy__purge does not say whether it can be undone: allowed, as no autonomy " \
                             "policy covers it."
    # A policy for one agent leaves the others' calls alone.
    only = Policy(id=5, name="Careful", scope="agent", agent="ops-bot", decisions=ALL_ASK)
    assert (
        policy.decide([only], agent="sales-bot", server="mail", tool="send_email", kind="none").decision
        == "allow"
    )


def test_a_policy_that_does_not_say_asks():
    broken = Policy(id=9, name="Half", scope="everything", decisions={"compensate_api": "maybe"})
    assert policy.decide([broken], agent="a", server="s", tool="t", kind="compensate", via="api",
                         dialect="hatp").decision == "ask"


def test_decisions_from_a_form_are_checked_for_every_class():
    decisions, problems = policy.clean_decisions({**policy.DEFAULT_DECISIONS, "none": "sometimes"})
    assert set(problems) == {"none"} and "none" not in decisions
    decisions, problems = policy.clean_decisions(policy.DEFAULT_DECISIONS)
    assert problems == {} and decisions == policy.DEFAULT_DECISIONS


def test_the_simulator_counts_each_decision_with_examples():
    calls = [
        {
            "agent": "sales-bot",
            "server": "crm",
            "tool": "update_deal",
            "kind": "compensate",
            "via": "api",
            "dialect": "hatp",
        }
    ] * 4 + [
        {"agent": "sales-bot", "server": "mail", "tool": "send_email", "kind": "none"},
        {"agent": "sales-bot", "server": "crm", "tool": "get_deal", "kind": "read_only"},
    ]
    tally = policy.simulate([everything(none="deny")], calls, examples=2)
    assert {d: t["count"] for d, t in tally.items()} == {"allow": 5, "ask": 0, "deny": 1}
    assert len(tally["allow"]["examples"]) == 2
    assert tally["deny"]["examples"] == [{"tool": "mail__send_email", "agent": "sales-bot", "reason": (
        "mail__send_email cannot be undone: denied by policy “Default” (every call).")}]


def compensation(number, **overrides):
    return {
        "number": number,
        "action": "compensate",
        "via": "api",
        "dialect": "hatp",
        "check_status": "ok",
        "side_effect": "",
        "cost": None,
        "needs_human": "",
        "server": "crm",
        "tool": "update_deal",
        **overrides,
    }


def test_a_plan_runs_without_a_human_only_when_everything_in_it_is_safe_and_the_policy_says_so():
    alone = Policy(
        id=1, name="Trusting", scope="everything", decisions=policy.DEFAULT_DECISIONS, auto_run_plans=True
    )
    read = {"number": 1, "action": "nothing_to_undo", "server": "crm", "tool": "get_deal"}
    assert policy.plan_needs_a_human([alone], agent="sales-bot", items=[compensation(2), read]) == ""
    cases = {
        "Step 4 cannot be undone.": [compensation(2), {"number": 4, "action": "cannot_undo"}],
        "Step 2 is not undone through the API with versions checked.": [compensation(2, via="ui")],
        "Step 3's check did not say the undo would work (conflict).": [
            compensation(3, check_status="conflict")
        ],
        "Step 2: undoing it has a side effect, a cost, or needs a human's judgement.": [
            compensation(2, side_effect="attendees get a cancellation notice")
        ],
        "It undoes nothing.": [read],
    }
    for reason, items in cases.items():
        assert policy.plan_needs_a_human([alone], agent="sales-bot", items=items) == reason
    careful = Policy(id=1, name="Default", scope="everything", decisions=policy.DEFAULT_DECISIONS)
    assert policy.plan_needs_a_human([careful], agent="sales-bot", items=[compensation(2)]) == (
        "Step 2: policy “Default” does not let plans run without a human.")
    assert policy.plan_needs_a_human([], agent="sales-bot", items=[compensation(2)]) == (
        "Step 2: no policy lets plans run without a human.")


def test_a_recipe_undo_is_checked_against_versions_only_when_its_read_took_one():
    assert policy.call_class(kind="compensate", via="api", dialect="recipe", versioned=True) == (
        "compensate_api")
    assert policy.call_class(kind="compensate", via="api", dialect="recipe") == "compensate_no_version"
    # The flag means nothing for another dialect: a SEP-3172 server reports no version.
    assert policy.call_class(kind="compensate", via="api", dialect="sep3172", versioned=True) == (
        "compensate_no_version")
