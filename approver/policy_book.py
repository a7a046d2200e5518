"""Reads of the autonomy policies: as they are now (and, for the Recorder, as it last read them), what they
decide for a call or a plan, what a draft would have decided, and whether their change log is intact. No
writes: those are `approver.services.policies`.
"""

from typing import Any

from journal.auth import roles
from journal.models import Step
from journal.ports import DEFAULT_HOLD_SECONDS
from journal.record import chain, keys, sql

from . import policy
from .models import AutonomyPolicy, Plan, PolicyChange

POLICY_LOG = "autonomy-policies"  # the name the change log's signed heads carry in place of a run id


def policy_record(policy_row: AutonomyPolicy) -> dict[str, Any]:
    """A policy as the change log keeps it (and the simulator and the page show it)."""
    return {
        "id": policy_row.pk,
        "name": policy_row.name,
        "scope": policy_row.scope,
        "agent": policy_row.agent.name if policy_row.agent_id else None,
        **({"team": policy_row.team.name} if policy_row.team_id else {}),  # older entries have no team
        "server": policy_row.server.name if policy_row.server_id else None,
        "tool": policy_row.tool or None,
        "decisions": dict(policy_row.decisions),
        "approverGroup": policy_row.approver_group,
        "quorum": policy_row.quorum,
        "askTimeout": policy_row.ask_timeout,
        "autoRunPlans": policy_row.auto_run_plans,
        "allowUnknownRetries": policy_row.allow_unknown_retries,
        "onFailure": policy_row.on_failure,
    }


def as_policy(policy_row: AutonomyPolicy) -> policy.Policy:
    return policy.Policy(
        id=policy_row.pk or 0,
        name=policy_row.name,
        scope=policy_row.scope,
        decisions=dict(policy_row.decisions or {}),
        agent=policy_row.agent.name if policy_row.agent_id else "",
        server=policy_row.server.name if policy_row.server_id else "",
        tool=policy_row.tool,
        auto_run_plans=policy_row.auto_run_plans,
        allow_unknown_retries=policy_row.allow_unknown_retries,
        on_failure=policy_row.on_failure,
        team=policy_row.team_id or 0,
        team_name=policy_row.team.name if policy_row.team_id else "",
    )


def plan_needs_a_human(plan: Plan) -> str:
    """Why this checked plan needs approvers (see `policy.plan_needs_a_human`), or "" if it may run alone."""
    if not plan.run.agent_id:
        return "The run has no agent whose policy could let it run alone."
    items = [
        {"number": row["step__number"], "server": row["step__server_name"], "tool": row["step__tool"], **row}
        for row in plan.items.order_by("position").values(
            "action",
            "via",
            "dialect",
            "check_status",
            "side_effect",
            "cost",
            "needs_human",
            "if_version",
            "step__number",
            "step__server_name",
            "step__tool",
        )
    ]
    return policy.plan_needs_a_human(
        [as_policy(row) for row in current_policies()], agent=plan.run.agent.name, items=items,
        team=plan.run.agent.team_id,
    )


def current_policies() -> list[AutonomyPolicy]:
    return list(AutonomyPolicy.objects.select_related("agent", "server", "team"))



def verify_policy_log():
    """Check the change log's chain and every signed head; name the first change that does not fit."""
    rows = list(PolicyChange.objects.order_by("id"))
    entries = [
        {"seq": r.seq, "ts": r.ts, "event": r.event, "data": r.data, "prevHash": r.prev_hash, "hash": r.hash}
        for r in rows
    ]
    checkpoints = [
        {"run": POLICY_LOG, "seq": r.seq, "headHash": r.hash, "keyId": r.key_id, "signature": r.signature}
        for r in rows
    ]
    return chain.verify(
        run=POLICY_LOG, entries=entries, checkpoints=checkpoints, public_keys=keys.public_keys()
    )


class PolicyBook:
    """The policies as the Recorder last read them, keyed by the change log's head: every change appends to
    the log, so one indexed read per call tells whether they moved (in any process), and only then are they
    read again. Reading them through the ORM on every call cost the Recorder about 3 ms a call under load.

    One book per gate (`approver.services.held_calls.HeldCallGate`); the Recorder calls it from its journal
    thread only."""

    def __init__(self):
        self.head: Any = None
        self.policies: list[policy.Policy] = []
        self.holds: dict[int, dict[str, Any]] = {}

    def now(self) -> tuple[list[policy.Policy], dict[int, dict[str, Any]]]:
        # Once per journal group (`sql.one_moment`): its calls are decided as at one moment.
        head = sql.remembered(("policy head",), lambda: sql.first_row(
            PolicyChange, ("seq", "hash"), "1 = 1 ORDER BY seq DESC LIMIT 1", []))
        if self.head != head:
            rows = current_policies()
            self.head, self.policies = head, [as_policy(row) for row in rows]
            self.holds = {row.pk: {"approverGroup": row.approver_group, "quorum": row.quorum,
                                   "askTimeout": row.ask_timeout} for row in rows}
        return self.policies, self.holds


# The book `decide_call` reads when it is given none (commands, tests).
BOOK = PolicyBook()


def decide_call(*, agent_name: str, server_name: str, tool: str, declaration, book: PolicyBook | None = None,
                retry_of: dict[str, Any] | None = None, team: int = 0) -> dict[str, Any]:
    """What the autonomy policies decide for an agent's call, as the run record keeps it. A change to the
    policies applies to the very next call (see `PolicyBook`). `declaration` is the tool's own
    (journal.undo.declarations.UndoDeclaration). An `ask` also carries how the call is held: who approves, how
    many, and how long the agent waits. `retry_of` is an earlier attempt of the same call whose outcome is
    unknown (see `policy.decide`)."""
    policies, holds = (book or BOOK).now()
    compensation = declaration.compensation
    decided = policy.decide(
        policies, agent=agent_name, server=server_name, tool=tool,
        kind=declaration.kind, via=declaration.via, dialect=compensation.dialect if compensation else None,
        reason=declaration.reason, remedy=declaration.remedy, source=declaration.source, retry_of=retry_of,
        versioned=bool(compensation and compensation.versioned), team=team)
    record = decided.as_record()
    if decided.policy is not None and decided.policy.allow_unknown_retries:
        record["allowUnknownRetries"] = True  # the agent's advice after a failure says a repeat goes through
    if retry_of is not None:
        record["retryOf"] = retry_of
    if decided.policy is not None and decided.policy.on_failure != "nothing":
        record["onFailure"] = decided.policy.on_failure  # a failure of this call stops the run (`sagas`)
    if decided.decision == "ask":
        default = {"approverGroup": roles.APPROVER, "quorum": 1, "askTimeout": DEFAULT_HOLD_SECONDS}
        record["hold"] = {
            **holds.get(decided.policy.id if decided.policy else 0, default),
            "why": decided.why,
        }
    return record


def recent_calls(last: int) -> list[dict[str, Any]]:
    """The agents' last `last` journaled calls, as `policy.decide` read them when they were made: the tool's
    own declaration as it was then, whether a recipe's read of the record took a version (`versioned`: the
    step kept its earlier state's version), and the earlier attempt a repeat was held for (`retry_of`)."""
    rows = (Step.objects.filter(run__agent__isnull=False).order_by("-id")
            .values_list("run__agent__name", "server_name", "tool", "declaration", "earlier_state",
                         "policy_decision", "run__agent__team_id")[:last])
    calls = []
    for agent_name, server_name, tool, declared, earlier, decided, team in rows:
        declared = declared if isinstance(declared, dict) else {}
        compensation = declared.get("compensation") if isinstance(declared.get("compensation"), dict) else {}
        decided = decided if isinstance(decided, dict) else {}
        retry_of = decided.get("retryOf")
        calls.append({"agent": agent_name, "server": server_name, "tool": tool,
                      "kind": declared.get("kind") or "unknown", "via": declared.get("via"),
                      "dialect": compensation.get("dialect"), "reason": declared.get("reason"),
                      "remedy": declared.get("remedy"), "source": declared.get("source") or "none",
                      "versioned": compensation.get("dialect") == "recipe"
                      and bool((earlier or {}).get("version")),
                      "retry_of": retry_of if isinstance(retry_of, dict) else None, "team": team,
                      "journaled": decided.get("decision") or ""})
    return calls


def replay(policies, calls: list[dict[str, Any]]) -> list[str]:
    """What `policies` decide for each of `calls` (`recent_calls`), in order."""
    return [policy.decide(policies, **_inputs(call)).decision for call in calls]


def _inputs(call: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in call.items() if key != "journaled"}


def simulate_policy(*, draft: AutonomyPolicy, last: int = 200) -> dict[str, Any]:
    """What the policies would have decided for the last `last` calls with `draft` saved: counts and
    examples per decision, and how many calls would be decided differently from today."""
    today = [as_policy(row) for row in current_policies()]
    drafted = [p for p in today if not draft.pk or p.id != draft.pk] + [as_policy(draft)]
    calls = recent_calls(last)
    changes = []
    for call in calls:
        before, after = policy.decide(today, **_inputs(call)), policy.decide(drafted, **_inputs(call))
        if before.decision != after.decision:
            changes.append({"tool": f"{call['server']}__{call['tool']}", "agent": call["agent"],
                            "before": before.decision, "after": after.decision})
    return {"calls": len(calls), "tally": policy.simulate(drafted, [_inputs(c) for c in calls]),
            "changed": len(changes),
            "changes": changes[:5]}

