"""Autonomy policies, as pure decisions: which class a call falls in, which policy governs it, and what that
policy decides (allow, ask a human first, or deny).

The question is not "may this agent act?" but "can we take it back if it is wrong?", so a call is classed by
what its tool server declares about undoing it, before it is made (the agent's own request never counts):

- `compensate_api`: the server can undo it through its API and reports versions (HATP, via api), or an
  admin's recipe undoes it and the Recorder read the record's version just before the call;
- `compensate_ui`: it can be undone, but only by a person in the server's own UI;
- `compensate_no_version`: a compensation is declared (SEP-3172, mcp-compensate, or a recipe with no read)
  but no version is ever reported, so a later change by someone else cannot be detected;
- `none`: the server says it cannot be undone;
- `unknown`: nothing is declared, or the declaration does not parse.

Reads (`read_only`) change nothing and are always allowed. A policy's scope is everything, one team's
agents, one agent, one tool server or one tool; the most specific policy that matches wins (tool, then
server, then agent, then team, then everything). Where no policy matches, the call is allowed (and
journaled): policies are the admins' to set, and the demo starts with `DEFAULT_DECISIONS` for everything.
Nothing here reads the database or the clock.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from journal.ports import MAX_HOLD_SECONDS

CLASSES = ("compensate_api", "compensate_ui", "compensate_no_version", "none", "unknown")
CLASS_WORDS = {
    "compensate_api": "can be undone through the API",
    "compensate_ui": "can be undone through the app's own screens, which its server replays",
    "compensate_no_version": "can be undone, but the server reports no versions, so a later change by "
                             "someone else would go unnoticed",
    "none": "cannot be undone",
    "unknown": "does not say whether it can be undone",
}
# The policy form's labels, one per class.
CLASS_LABELS = {
    "compensate_api": "Can be undone through the API",
    "compensate_ui": "Can be undone through the app's own screens",
    "compensate_no_version": "Can be undone, but without versions (later changes go unseen)",
    "none": "Cannot be undone",
    "unknown": "The server does not say",
}
CLASS_SHORT = {
    "compensate_api": "Undo via API",
    "compensate_ui": "Undo via UI",
    "compensate_no_version": "No version",
    "none": "Cannot undo",
    "unknown": "Unknown",
}
READ = "read"
DECISIONS = ("allow", "ask", "deny")
SCOPES = ("tool", "server", "agent", "team", "everything")  # most specific first
# The demo's starting point, and the policy page's suggestion: act freely where the API can take it back.
DEFAULT_DECISIONS = {"compensate_api": "allow", "compensate_ui": "ask", "compensate_no_version": "ask",
                     "none": "ask", "unknown": "ask"}


@dataclass(frozen=True)
class Policy:
    """A policy as the decision needs it. `server` and `tool` are names (`tool` within `server`); `team` is
    the team's id (`team_name` its name, for the words)."""

    id: int
    name: str
    scope: str
    decisions: Mapping[str, str]
    agent: str = ""
    server: str = ""
    tool: str = ""
    auto_run_plans: bool = False
    allow_unknown_retries: bool = False
    on_failure: str = "nothing"  # nothing | propose | unwind (ChronoMCP's saga mode)
    team: int = 0
    team_name: str = ""

    def matches(self, *, agent: str, server: str, tool: str, team: int = 0) -> bool:
        if self.scope == "everything":
            return True
        if self.scope == "team":
            return bool(team) and self.team == team
        if self.scope == "agent":
            return self.agent == agent
        if self.scope == "server":
            return self.server == server
        return self.scope == "tool" and self.server == server and self.tool == tool

    @property
    def where(self) -> str:
        return {
            "everything": "every call",
            "agent": f"agent {self.agent}",
            "team": f"team {self.team_name}'s agents",
            "server": f"tool server {self.server}",
            "tool": f"{self.server}__{self.tool}",
        }.get(self.scope, self.scope)


@dataclass(frozen=True)
class Decision:
    decision: str  # allow | ask | deny
    call_class: str
    policy: Policy | None
    reason: str
    why: dict[str, str] = field(default_factory=dict)  # the declaration's own words: reason, remedy, source

    def as_record(self) -> dict[str, object]:
        """What the run record keeps of the decision."""
        return {"decision": self.decision, "class": self.call_class, "reason": self.reason,
                "policy": {"id": self.policy.id, "name": self.policy.name, "scope": self.policy.where}
                if self.policy else None}


def call_class(*, kind: str, via: str | None, dialect: str | None, versioned: bool = False) -> str:
    """The class of a call from its tool's declaration (`kind`, `via`, and the compensation's dialect); an
    admin's recipe whose read of the record took a version (`versioned`) is checked against versions."""
    if kind == "read_only":
        return READ
    if kind == "compensate":
        checked = dialect in ("recipe", "database") and versioned
        if dialect is not None and dialect != "hatp" and not checked:
            return "compensate_no_version"
        return "compensate_ui" if via == "ui" else "compensate_api"
    if kind == "none":
        return "none"
    return "unknown"


def governing(policies: Iterable[Policy], *, agent: str, server: str, tool: str, team: int = 0
              ) -> Policy | None:
    """The most specific policy that matches the call (of an agent of team `team`), or None when none does."""
    matching = [p for p in policies if p.matches(agent=agent, server=server, tool=tool, team=team)]
    matching.sort(key=lambda p: (SCOPES.index(p.scope), p.id))
    return matching[0] if matching else None


def decide(
    policies: Iterable[Policy],
    *,
    agent: str,
    server: str,
    tool: str,
    kind: str,
    via: str | None = None,
    dialect: str | None = None,
    reason: str | None = None,
    remedy: str | None = None,
    source: str = "none",
    retry_of: Mapping[str, object] | None = None,
    versioned: bool = False,
    team: int = 0,
) -> Decision:
    """What the governing policy decides for this call. Without any policy, the defaults apply.

    `retry_of` is the earlier attempt of the very same call whose outcome is unknown (the server had it and
    never answered, or the agent never saw the answer), found by the Recorder only for tools that are neither
    read-only nor idempotent: a repeat may act twice, so it is held for a human ("ask") unless the governing
    policy lets such repeats through or denies the call anyway (MCP-Rescue's retry guard)."""
    klass = call_class(kind=kind, via=via, dialect=dialect, versioned=versioned)
    name = f"{server}__{tool}"
    why = {k: v for k, v in (("reason", reason), ("remedy", remedy), ("source", source)) if v}
    if klass == READ:
        return Decision("allow", klass, None, f"{name} only reads: nothing to undo.", why)
    chosen = governing(policies, agent=agent, server=server, tool=tool, team=team)
    decided = _by_class(chosen, klass, name, reason, why)
    if (
        retry_of is None
        or decided.decision == "deny"
        or (chosen is not None and chosen.allow_unknown_retries)
    ):
        return decided
    first = f"step {retry_of.get('step')}"
    return Decision(
        "ask",
        klass,
        chosen,
        (
            f"{name} is repeated with the same arguments, and its first attempt ({first}: "
            f"{retry_of.get('what')}) may "
            f"already have acted: a human must approve this repeat first"
            + (f" (policy “{chosen.name}” does not let such repeats through)." if chosen else ".")
        ),
        {**why, "retryOf": dict(retry_of)},
    )


def _by_class(
    chosen: Policy | None, klass: str, name: str, reason: str | None, why: dict[str, str]
) -> Decision:
    if chosen is None:  # no policy at all: the Recorder journals, and the agent acts as it did before
        return Decision("allow", klass, None, f"{name} {CLASS_WORDS[klass]}: allowed, as no autonomy policy "
                                              "covers it.", why)
    decision = chosen.decisions.get(klass)
    if decision not in DECISIONS:
        decision = "ask"  # a policy that does not say is read as "ask a human", never as "allow"
    because = f" ({reason})" if reason and klass in ("none", "unknown") else ""
    verb = {"allow": "allowed", "ask": "a human must approve it first", "deny": "denied"}[decision]
    return Decision(
        decision,
        klass,
        chosen,
        f"{name} {CLASS_WORDS[klass]}{because}: {verb} by policy “{chosen.name}” ({chosen.where}).",
        why,
    )


def clean_decisions(raw: Mapping[str, object]) -> tuple[dict[str, str], dict[str, str]]:
    """A decision for every class, from a form or an API body: (decisions, problems by class)."""
    decisions, problems = {}, {}
    for klass in CLASSES:
        value = raw.get(klass)
        if value not in DECISIONS:
            problems[klass] = f"Choose allow, ask or deny for calls that {CLASS_WORDS[klass]}."
        else:
            decisions[klass] = value
    return decisions, problems


def draft_problems(
    *,
    name: str,
    scope: str,
    agent_chosen: bool,
    team_chosen: bool = False,
    server_chosen: bool,
    tool: str,
    server_name: str,
    server_tools: set[str] | None,
    quorum: int | None,
    ask_timeout: int | None,
    approver_group: str,
    groups: Iterable[str],
) -> dict[str, str]:
    """What is wrong with a policy draft's own fields, by form field (the decisions are `clean_decisions`'s;
    whether another policy already covers the same scope is a question for the database)."""
    groups = tuple(groups)
    problems: dict[str, str] = {}
    if not (name or "").strip():
        problems["name"] = "Give the policy a name."
    problems.update(_scope_problems(scope=scope, agent_chosen=agent_chosen, team_chosen=team_chosen,
                                    server_chosen=server_chosen, tool=tool, server_name=server_name,
                                    server_tools=server_tools))
    if not quorum or quorum < 1:
        problems["quorum"] = "At least one approver must sign a held call."
    if not 1 <= (ask_timeout or 0) <= MAX_HOLD_SECONDS:
        problems["ask_timeout"] = "A held call can wait between 1 second and 1 hour."
    if approver_group not in groups:
        problems["approver_group"] = f"Choose one of the groups: {', '.join(groups)}."
    return problems


def _scope_problems(*, scope: str, agent_chosen: bool, team_chosen: bool, server_chosen: bool, tool: str,
                    server_name: str, server_tools: set[str] | None) -> dict[str, str]:
    """What is wrong with what a draft says it covers."""
    problems: dict[str, str] = {}
    if scope not in SCOPES:
        problems["scope"] = "Choose what the policy covers."
    if scope == "agent" and not agent_chosen:
        problems["agent"] = "Choose the agent this policy is for."
    if scope == "team" and not team_chosen:
        problems["team"] = "Choose the team whose agents this policy is for."
    if scope in ("server", "tool") and not server_chosen:
        problems["server"] = "Choose the tool server this policy is for."
    if scope == "tool" and not (tool or "").strip():
        problems["tool"] = "Name the tool this policy is for."
    if scope == "tool" and server_tools is not None and tool and tool not in server_tools:
        problems["tool"] = f"{server_name} offers no tool named {tool!r}."
    return problems


def simulate(policies: Iterable[Policy], calls: Iterable[Mapping[str, object]], *, examples: int = 3
             ) -> dict[str, dict[str, object]]:
    """What `policies` would have decided for each of `calls` (dicts of `decide`'s keyword arguments):
    per decision, how many and up to `examples` of them (tool, agent and the reason)."""
    policies = list(policies)
    tally: dict[str, dict[str, object]] = {d: {"count": 0, "examples": []} for d in DECISIONS}
    for call in calls:
        decided = decide(policies, **call)
        bucket = tally[decided.decision]
        bucket["count"] += 1
        if len(bucket["examples"]) < examples:
            bucket["examples"].append({"tool": f"{call['server']}__{call['tool']}", "agent": call["agent"],
                                       "reason": decided.reason})
    return tally


def plan_needs_a_human(
    policies: Iterable[Policy], *, agent: str, items: Iterable[Mapping[str, object]], team: int = 0
) -> str:
    """Why a checked reversal plan still needs a human to sign it, or "" when it may run alone: every item
    either changes nothing or is a compensation through the API (HATP, so versions are checked), whose check
    said ok, with no side effect, no cost and nothing a human must decide, and the policy governing the
    original call lets such plans run without a human. `items` carry `number`, `action`, `via`, `dialect`,
    `check_status`, `side_effect`, `cost`, `needs_human`, `server` and `tool`."""
    policies = list(policies)
    compensations = 0
    for item in items:
        where = f"Step {item['number']}"
        if item["action"] in ("nothing_to_undo", "already_undone"):
            continue
        if item["action"] != "compensate":
            return f"{where} cannot be undone."
        compensations += 1
        if (
            call_class(kind="compensate", via=item.get("via"), dialect=item.get("dialect"),
                       versioned=bool(item.get("if_version")))
            != "compensate_api"
        ):
            return f"{where} is not undone through the API with versions checked."
        if item.get("check_status") != "ok":
            status = item.get("check_status") or "not checked"
            return f"{where}'s check did not say the undo would work ({status})."
        if item.get("side_effect") or item.get("cost") or item.get("needs_human"):
            return f"{where}: undoing it has a side effect, a cost, or needs a human's judgement."
        chosen = governing(policies, agent=agent, server=str(item["server"]), tool=str(item["tool"]),
                           team=team)
        if chosen is None or not chosen.auto_run_plans:
            said = f"policy “{chosen.name}” does not let" if chosen else "no policy lets"
            return f"{where}: {said} plans run without a human."
    return "" if compensations else "It undoes nothing."
