"""Autonomy policies: every change to them, each appended to their hash-chained change log with its new head
signed by the Recorder's key. A change applies to the Recorder's very next call (`policy_book.PolicyBook`)."""

from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from journal.auth import roles
from journal.errors import Refused
from journal.record import chain, keys

from .. import policy
from ..models import AutonomyPolicy, PolicyChange
from ..policy_book import POLICY_LOG, as_policy, policy_record


class PolicyRefused(Refused):
    """A policy edit that cannot be saved; `problems` maps field names to what is wrong."""

    def __init__(self, problems: dict[str, str]):
        super().__init__("; ".join(problems.values()))
        self.problems = problems


def clean_policy(row: AutonomyPolicy) -> None:
    """Check a draft before it is saved or simulated; PolicyRefused names every problem."""
    problems: dict[str, str] = {}
    decisions, wrong = policy.clean_decisions(row.decisions or {})
    problems.update({f"decision_{klass}": text for klass, text in wrong.items()})
    row.decisions = decisions
    problems.update(policy.draft_problems(
        name=row.name, scope=row.scope, agent_chosen=bool(row.agent_id), team_chosen=bool(row.team_id),
        server_chosen=bool(row.server_id),
        tool=row.tool, server_name=row.server.name if row.server_id else "",
        server_tools=row.server.tool_names if row.server_id else None, quorum=row.quorum,
        ask_timeout=row.ask_timeout, approver_group=row.approver_group, groups=roles.ALL))
    if row.scope != AutonomyPolicy.Scope.AGENT:
        row.agent = None
    if row.scope != AutonomyPolicy.Scope.TEAM:
        row.team = None
    if row.scope not in (AutonomyPolicy.Scope.SERVER, AutonomyPolicy.Scope.TOOL):
        row.server = None
    if row.scope != AutonomyPolicy.Scope.TOOL:
        row.tool = ""
    clash = AutonomyPolicy.objects.exclude(pk=row.pk).filter(scope=row.scope)
    clash = {"agent": clash.filter(agent_id=row.agent_id), "team": clash.filter(team_id=row.team_id),
             "server": clash.filter(server_id=row.server_id),
             "tool": clash.filter(server_id=row.server_id, tool=row.tool)}.get(row.scope, clash).first()
    if clash is not None and not problems:
        problems["scope"] = f"“{clash.name}” already covers {as_policy(clash).where}; edit that one instead."
    if problems:
        raise PolicyRefused(problems)


def save_policy(*, row: AutonomyPolicy, by, now: datetime | None = None) -> AutonomyPolicy:
    """Create or change a policy and log the change (who, when, before, after). Takes effect at the next call:
    the Recorder reads the policies for every call."""
    now = now or timezone.now()
    clean_policy(row)
    with transaction.atomic():
        before = None
        if row.pk:
            before = policy_record(
                # Only the policy row is locked: PostgreSQL cannot lock the nullable side of an outer join.
                AutonomyPolicy.objects.select_for_update(of=("self",))
                .select_related("agent", "server", "team")
                .get(pk=row.pk)
            )
        row.updated_at = now
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError:
            raise PolicyRefused(
                {"scope": "Another policy already covers this; edit that one instead."}
            ) from None
        log_change("policy_changed" if before else "policy_created", by=by, now=now, before=before,
                           after=policy_record(row))
    return row


def delete_policy(*, row: AutonomyPolicy, by, now: datetime | None = None) -> None:
    now = now or timezone.now()
    with transaction.atomic():
        before = policy_record(row)
        row.delete()
        log_change("policy_deleted", by=by, now=now, before=before, after=None)


def log_change(event: str, *, by, now: datetime, before, after) -> PolicyChange:
    """Append to the change log of the policies and the approval rules (`approval_rules`), hash-chained and
    with its new head signed; the caller holds the transaction that makes the change. The last entry is
    locked while
    appending; the unique `seq` is the backstop if two admins save at the same instant."""
    last = PolicyChange.objects.select_for_update().order_by("-seq").first()
    entry = chain.make_entry(seq=(last.seq if last else 0) + 1, ts=chain.format_ts(now), event=event,
                             data={"by": by.get_username(), "before": before, "after": after},
                             prev_hash=last.hash if last else chain.GENESIS)
    key_id, private = keys.signing_key()
    signature = chain.sign(
        private, chain.checkpoint_payload(run=POLICY_LOG, seq=entry["seq"], head_hash=entry["hash"])
    )
    return PolicyChange.objects.create(seq=entry["seq"], ts=entry["ts"], event=event, data=entry["data"],
                                       prev_hash=entry["prevHash"], hash=entry["hash"], key_id=key_id,
                                       signature=signature)

