"""Which steps a plan takes back, in which order, and how: pure functions, no database."""

from datetime import UTC, datetime, timedelta

import pytest

from approver import planning, wording
from approver.models import PlanItem
from approver.planning import StepFacts
from journal.undo.declarations import NO_VERSION_PROBLEM

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PLAN = "0b5e7a1c-0000-4000-8000-000000000001"
SECRET = b"the secret the idempotency keys are derived with"
KEYS = {"plan_id": PLAN, "key_secret": SECRET}

HATP_COMPENSATION = {"tool": "hatp_compensate", "dialect": "hatp", "bindings": {}}


def step(number: int, **overrides) -> StepFacts:
    facts = {
        "id": 100 + number, "number": number, "server": "crm", "tool": "update_deal", "status": "ok",
        "reversibility": "compensate",
        "declaration": {"kind": "compensate", "via": "api", "compensation": HATP_COMPENSATION,
                        "side_effect": None, "cost": None, "remedy": None, "reason": None},
        "compensation_arguments": {"compensationToken": f"ctk_{number}"}, "undo_problems": (),
        "effect_summary": f"change {number}", "effect_resource": f"crm://acme/deal/D-{number}",
        "effect_version": f"v{number}", "undo_by": NOW + timedelta(days=7),
        "finished_at": NOW - timedelta(minutes=60 - number),
    }
    facts.update(overrides)
    return StepFacts(**facts)


def test_undo_from_step_n_takes_that_step_and_every_later_one():
    steps = [step(n) for n in range(1, 6)]
    pulled = planning.closure(steps, {3, 4, 5})
    assert sorted(pulled) == [3, 4, 5]
    assert {p.rule for p in pulled.values()} == {"chosen"}


def test_without_better_knowledge_every_later_step_depends_on_every_earlier_one():
    steps = [step(n) for n in range(1, 5)]
    pulled = planning.closure(steps, {2})
    assert sorted(pulled) == [2, 3, 4]
    assert pulled[3] == planning.Pull("all-earlier", 2) and pulled[4] == planning.Pull("all-earlier", 2)


def test_a_step_that_declared_its_dependencies_is_pulled_in_only_by_them():
    steps = [
        step(1),
        step(2),
        step(3, declared_deps=(1,)),
        step(4, declared_deps=(2,)),
        step(5, declared_deps=()),
    ]
    pulled = planning.closure(steps, {2})
    assert sorted(pulled) == [2, 4]
    assert pulled[4] == planning.Pull("declared", 2)


def test_an_inferred_link_pulls_a_step_in_and_shows_the_pointers():
    pointers = ({"from": "/structuredContent/id", "to": "/deal_id"},)
    steps = [step(1), step(2), step(3, declared_deps=(), inferred_deps={2: pointers})]
    pulled = planning.closure(steps, {2})
    assert pulled[3] == planning.Pull("inferred", 2, pointers)


def test_dependencies_are_followed_transitively():
    steps = [step(1), step(2, declared_deps=(1,)), step(3, declared_deps=(2,)), step(4, declared_deps=())]
    assert sorted(planning.closure(steps, {1})) == [1, 2, 3]


def test_asking_for_a_step_the_run_does_not_have_is_refused():
    with pytest.raises(planning.PlanningError, match="no step 9"):
        planning.closure([step(1)], {9})


def test_items_come_in_reverse_completion_order():
    # Step 2 finished after step 3 (they ran concurrently): it is undone first.
    steps = [step(1), step(2, finished_at=NOW), step(3, finished_at=NOW - timedelta(seconds=5))]
    items = planning.draft_items(steps, planning.closure(steps, {1}), **KEYS, now=NOW)
    assert [(i.position, i.step.number) for i in items] == [(1, 2), (2, 3), (3, 1)]


def test_a_compensation_carries_its_resolved_arguments_version_and_a_stable_idempotency_key():
    [item] = planning.draft_items([step(1)], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "compensate" and item.tool == "hatp_compensate" and item.dialect == "hatp"
    assert item.arguments == {"compensationToken": "ctk_1"} and item.if_version == "v1"
    assert item.idempotency_key == planning.idempotency_key(PLAN, 1, SECRET)
    assert item.idempotency_key.startswith(f"undo:{PLAN}:1:")


def test_a_compensations_idempotency_key_cannot_be_guessed_from_the_plan_and_step():
    # An agent is told a plan's id (a saga's undoPlan): a key it could work out, it could send first and
    # turn the compensation into a replay of its own call (issue 22, finding 16).
    key = planning.idempotency_key(PLAN, 1, SECRET)
    assert key != f"undo-{PLAN}-1" and key != planning.idempotency_key(PLAN, 1, b"another secret")
    assert len(key.rsplit(":", 1)[1]) == 32 and len(key) <= 100


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"undo_problems": ("a binding does not resolve: /transactionId is missing",)},
            "a binding does not resolve",
        ),
        ({"undo_by": NOW - timedelta(minutes=1)}, "the undo window closed at"),
        ({"compensation_arguments": None}, "no compensation could be prepared"),
    ],
)
def test_a_step_that_cannot_be_undone_automatically_says_so_plainly(overrides, expected):
    [item] = planning.draft_items([step(1, **overrides)], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "cannot_undo"
    assert item.reason.startswith("Not automatically undoable: ") and expected in item.reason
    assert item.tool == "" and item.arguments is None  # nothing that could be run by mistake


def test_a_step_without_a_version_is_listed_for_undo_but_flagged_for_a_human():
    facts = step(1, effect_version="", undo_problems=(NO_VERSION_PROBLEM,))
    [item] = planning.draft_items([facts], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "compensate" and item.if_version == ""
    assert (
        item.needs_human
        == "No version was reported, so a later change could not be detected: a human must decide."
    )


def test_an_irreversible_step_keeps_the_servers_reason_and_remedy():
    declaration = {
        "kind": "none",
        "reason": "delivered to external recipients",
        "remedy": "send a correction email",
    }
    [item] = planning.draft_items([step(1, reversibility="none", declaration=declaration)],
                                  {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert (item.action, item.reason, item.remedy) == (
        "cannot_undo", "delivered to external recipients", "send a correction email")


def test_an_undeclared_step_is_unknown_never_safe():
    [item] = planning.draft_items([step(1, reversibility="unknown", declaration={"kind": "unknown"})],
                                  {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "cannot_undo" and "says nothing about undoing" in item.reason
    assert "by hand" in item.remedy


@pytest.mark.parametrize(("overrides", "action"), [
    ({"reversibility": "read_only"}, "nothing_to_undo"),
    ({"status": "error"}, "nothing_to_undo"),
    ({"status": "error", "reversibility": "unknown",
      "undo_problems": ("the server did not answer, so it may or may not have acted",)}, "cannot_undo"),
    ({"status": "pending", "finished_at": None}, "cannot_undo"),
    ({"already_undone": True}, "already_undone"),
])
def test_reads_failures_calls_in_doubt_and_undone_steps(overrides, action):
    [item] = planning.draft_items([step(1, **overrides)], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == action and item.reason


def test_the_digest_changes_with_any_change_to_the_content():
    item = planning.item_content(
        position=1,
        step=1,
        server="crm",
        tool="update_deal",
        action="compensate",
        rule="chosen",
        pulled_in_by=None,
        compensation={
            "tool": "hatp_compensate",
            "arguments": {"compensationToken": "ctk_1"},
            "ifVersion": "v1",
            "idempotencyKey": "k",
        },
        needs_human="",
        via="api",
        side_effect="",
        cost=None,
        undo_by=None,
        reason="",
        remedy="",
        effect={"summary": "s", "resource": "r", "version": "v1"},
        check={"status": "pending"},
    )
    content = planning.plan_content(plan={"plan": PLAN}, items=[item])
    checked = planning.plan_content(plan={"plan": PLAN}, items=[{**item, "check": {"status": "ok"}}])
    other_args = planning.plan_content(plan={"plan": PLAN}, items=[
        {**item, "compensation": {**item["compensation"], "arguments": {"compensationToken": "ctk_2"}}}])
    assert len({planning.digest(content), planning.digest(checked), planning.digest(other_args)}) == 3
    # Key order does not matter (JCS): the same content always has the same digest.
    assert planning.digest(dict(reversed(list(content.items())))) == planning.digest(content)


def test_a_call_held_or_stopped_by_a_policy_has_nothing_to_undo():
    held = step(1, status="held", reversibility="none")
    [item] = planning.draft_items([held], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "nothing_to_undo" and "Held for approval and not made" in item.reason
    # Refused by a policy: never forwarded, even when nobody can say what the tool does.
    refused = step(1, status="error", reversibility="unknown", failure_class="policy")
    [item] = planning.draft_items([refused], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "nothing_to_undo" and "never sent" in item.reason


def test_the_remedy_of_a_step_nobody_can_undo_names_what_is_known():
    """Issue 23: "Check fs by hand" told an on-call engineer nothing they did not know."""
    undeclared = step(1, server="kv", tool="set", reversibility="unknown", declaration={"kind": "unknown"},
                      compensation_arguments=None, arguments={"key": "session:42", "value": "x" * 100},
                      server_tools=("get", "set", "delete", "list", "restore_snapshot"))
    [item] = planning.draft_items([undeclared], {1: planning.Pull("chosen")}, **KEYS, now=NOW)
    assert item.action == "cannot_undo"
    assert item.remedy.startswith(
        "Check kv by hand for what set did (it was sent key='session:42', value='xxx")
    assert "kv offers delete, restore_snapshot, which may take it back." in item.remedy


@pytest.mark.parametrize(("tool", "tools", "found"), [
    ("create_entities", ("create_entities", "delete_entities", "read_graph"), ["delete_entities"]),
    ("add_observations", ("add_observations", "delete_observations"), ["delete_observations"]),
    ("write_file", ("write_file", "read_file", "move_file"), []),
    ("git_commit", ("git_commit", "git_reset"), []),
])
def test_inverse_looking_tools_are_named_never_guessed_into_a_call(tool, tools, found):
    assert planning.inverse_tools(tool, tools) == found


@pytest.mark.parametrize("summary, fields, words", [
    ("Deal D-881 stage: Proposal → Won", {"before": {"stage": "Proposal"}, "after": {"stage": "Won"}},
     "Put back stage: Won → Proposal (the agent's change was “Deal D-881 stage: Proposal → Won”)"),
    ("", {"before": {"amount": 40000, "stage": "Proposal", "owner": "dana"},
          "after": {"amount": 45000, "stage": "Won", "owner": "dana"}},
     "Put back amount: 45000 → 40000; stage: Won → Proposal"),  # only what changed
    ("Deal D-881 stage: Proposal → Won", None,
     "Take back the agent's change “Deal D-881 stage: Proposal → Won”"),
    ("Deal D-881 stage: Proposal → Won", {"before": None, "after": {"stage": "Won"}, "unreadable": True},
     "Take back the agent's change “Deal D-881 stage: Proposal → Won”"),
    ("", "not a mapping", ""),
])
def test_an_undo_reads_as_the_change_it_makes(summary, fields, words):
    assert wording.undo_words(summary, fields) == words


@pytest.mark.parametrize("rows, by, overwrite", [
    ([{"field": "stage", "before": "Proposal", "left": "Won", "now": "Won"},
      {"field": "amount", "before": 1, "left": 1, "now": 2}], "priya",
     "Undo the stage anyway: priya's amount change is kept"),
    ([{"field": "stage", "before": "Proposal", "left": "Won", "now": "Negotiation"}], "priya",
     "Undo the stage anyway, overwriting priya's change to the stage"),
    ([], "", "Undo it anyway, over the newer change"),
])
def test_the_answers_to_a_conflict_say_what_they_do_to_the_record(rows, by, overwrite):
    item = PlanItem(check_detail={"current": {"changedBy": by}, "threeWay": {"fields": rows}})
    assert item.choice_words["overwrite"] == overwrite
    assert item.choice_words["keep"] == (f"Leave it as {by} left it: skip this undo" if by
                                         else "Leave it as it is now: skip this undo")
