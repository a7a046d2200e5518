"""Calls an autonomy policy holds for a human: the gate the Recorder asks before forwarding a call
(`HeldCallGate`, plugged into `journal.ports` when the app starts), the request a held call waits on, and
what becomes of it (used once when approved, expired when nobody decides in time). Decisions on held calls
are signed in `approvals`."""

import hashlib
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from journal import ports
from journal import services as journal_services
from journal.auth import roles
from journal.record.canonical import canonical_bytes

from .. import authority
from ..models import ActionRequest, ApprovalRules
from ..policy_book import PolicyBook, decide_call
from . import bell, following, sagas


def action_digest(*, agent: str, server: str, tool: str, arguments: Any, meta: Any = None) -> str:
    """What an approval of a held call binds: the agent, the server, the tool, and the exact arguments and
    `_meta` that are sent (a call with no `_meta` is digested without the key)."""
    content = {"agent": agent, "server": server, "tool": tool, "arguments": arguments}
    if meta is not None:
        content["meta"] = meta
    return hashlib.sha256(canonical_bytes(content)).hexdigest()


def action_url(action: ActionRequest) -> str:
    return settings.PUBLIC_URL.rstrip("/") + reverse("approver:action_detail", args=[action.public_id])


def request_for_held_call(*, agent, server, tool: str, arguments: dict[str, Any], decision: dict[str, Any],
                          run_id: int, step_id: int, now: datetime | None = None,
                          meta: dict[str, Any] | None = None) -> ActionRequest:
    """The action request a held call waits on: the open one for the same exact call (so an agent that asks
    again does not pile up requests), or a new one, which approvers are told of."""
    now = now or timezone.now()
    digest = action_digest(agent=agent.name, server=server.name, tool=tool, arguments=arguments, meta=meta)
    with transaction.atomic():
        existing = (
            ActionRequest.objects.select_for_update()
            .filter(
                digest=digest,
                state__in=[ActionRequest.State.PENDING, ActionRequest.State.APPROVED],
                expires_at__gt=now,
            )
            .order_by("created_at")
            .first()
        )
        if existing is not None:
            return existing
        _refuse_beyond_the_cap(agent, now)
        hold = decision.get("hold") or {}
        chosen = decision.get("policy") or {}
        action = ActionRequest.objects.create(
            agent=agent,
            run_id=run_id,
            step_id=step_id,
            server=server,
            tool=tool,
            arguments=arguments,
            meta=meta,
            digest=digest,
            call_class=decision.get("class", "unknown"),
            reason=decision.get("reason", ""),
            why=hold.get("why") or {},
            policy_id=chosen.get("id") or None,
            policy_name=chosen.get("name") or "",
            approver_group=hold.get("approverGroup") or roles.APPROVER,
            quorum=hold.get("quorum") or 1,
            created_at=now,
            expires_at=now + ApprovalRules.current(agent.team_id).valid_for,
        )
        journal_services.record_event(run_id=run_id, event="action_requested", now=now, data={
            "action": str(action.public_id), "digest": digest, "tool": tool, "server": server.name,
            "reason": action.reason})
        bell.ring(bell.NOTIFY_ACTION_REQUESTED, action.pk)
    return action


def _refuse_beyond_the_cap(agent, now: datetime) -> None:
    """An agent may have `HELD_CALLS_PER_AGENT` calls waiting on approvers (pending, or approved and not yet
    made) at once: one more is refused, not held, so a flood of distinct calls asks nobody."""
    cap = settings.HELD_CALLS_PER_AGENT
    waiting = ActionRequest.objects.filter(agent=agent, expires_at__gt=now, state__in=[
        ActionRequest.State.PENDING, ActionRequest.State.APPROVED]).count()
    if waiting >= cap:
        raise ports.HoldRefused(
            f"Not done: {agent.name} already has {waiting} calls waiting for approval, as many as it may "
            f"(HELD_CALLS_PER_AGENT = {cap}), so this one was not held and nothing was sent. Make it again "
            "once approvers have decided on some of them.")


def held_call_state(action_id: int) -> tuple[str, str, str, datetime] | None:
    """Where a held call's request stands (state, decided by, the decision's reason, expiry): what a waiting
    Recorder polls, one indexed read."""
    return ActionRequest.objects.filter(pk=action_id).values_list(
        "state", "decided_by", "decision_reason", "expires_at").first()


def claim_approved_action(*, action_id: int, opened: journal_services.OpenedStep, meta: dict[str, Any] | None,
                          now: datetime | None = None) -> bool:
    """Let one call through on an approval: approved becomes used, once, and the held step `opened` is
    released to be sent with `meta` (the `_meta` the approval covers, with the Recorder's key), in one
    transaction, each a conditional update. Nothing changes unless the step is still held: a step the record
    already says was never sent (the agent stopped waiting or was told to call again, its Recorder stopped)
    is never sent, and the approval stays for the agent's next identical call. Its approvals are checked
    again first, as a plan's are before it runs: one whose passkey was revoked, or whose approver left the
    role or was deactivated, no longer counts, and a request short of its quorum is pending again (the call
    keeps waiting, and the approvers are asked anew)."""
    now = now or timezone.now()
    with transaction.atomic():
        action = (ActionRequest.objects.select_for_update(of=("self",)).select_related("agent")
                  .filter(pk=action_id, state=ActionRequest.State.APPROVED, expires_at__gt=now).first())
        if action is None:
            return False
        counted = authority.counting_action_approvals(action=action)
        if len(counted) < action.quorum:
            ActionRequest.objects.filter(pk=action.pk).update(
                state=ActionRequest.State.PENDING, decided_at=None, decided_by="", notified=False)
            if action.run_id:
                journal_services.record_event(
                    run_id=action.run_id,
                    event="action_lapsed",
                    now=now,
                    data={
                        "action": str(action.public_id),
                        "counting": sorted(a.approver.get_username() for a in counted),
                        "quorum": action.quorum,
                        "why": "an approval no longer counts (passkey revoked, or the approver "
                        "lost the role or was deactivated)",
                    },
                )
            bell.ring(bell.NOTIFY_ACTION_REQUESTED, action.pk)
            return False
        # The action's row is locked, so it is still approved: the step decides. Released first, and only if
        # still held; the approval is used only then.
        if not journal_services.release_held_step(opened=opened, now=now, approval={
                "action": str(action.public_id), "approvedBy": action.decided_by, "meta": meta}):
            return False
        used = bool(ActionRequest.objects.filter(pk=action_id, state=ActionRequest.State.APPROVED)
                    .update(state=ActionRequest.State.USED, used_at=now, used_step_id=opened.step_id))
        if used:  # plans drafted while it was held follow it (`following`)
            following.after_commit(step_id=action.step_id, now=now, why=(
                f"the approved call held at its step was sent, as step {opened.number}"))
        return used


def expire_held_calls(*, now: datetime | None = None) -> int:
    """Close held-call requests past their time: undecided, or approved but never used. The agent must ask
    again, and approvers see them as expired."""
    now = now or timezone.now()
    expired = 0
    for action in ActionRequest.objects.filter(
            state__in=[ActionRequest.State.PENDING, ActionRequest.State.APPROVED], expires_at__lte=now):
        with transaction.atomic():
            if ActionRequest.objects.filter(pk=action.pk, state=action.state).update(
                    state=ActionRequest.State.EXPIRED, decided_at=action.decided_at or now):
                expired += 1
                if action.run_id:
                    journal_services.record_event(
                        run_id=action.run_id,
                        event="action_expired",
                        now=now,
                        data={"action": str(action.public_id), "was": action.state},
                    )
    return expired



class HeldCallGate:
    """The Recorder's policy gate (`journal.ports.PolicyGate`), answered by the autonomy policies and the
    held-call requests above. It keeps its own `PolicyBook`, read again whenever the policies change."""

    def __init__(self):
        self.book = PolicyBook()

    def decide(self, *, agent_name: str, server_name: str, tool: str, declaration,
               retry_of: dict[str, Any] | None = None, team: int = 0) -> dict[str, Any]:
        return decide_call(agent_name=agent_name, server_name=server_name, tool=tool, declaration=declaration,
                           book=self.book, retry_of=retry_of, team=team)

    def hold(self, *, agent, server, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None,
             decision: dict[str, Any], run_id: int, step_id: int, now: datetime) -> ports.HeldCall:
        action = request_for_held_call(agent=agent, server=server, tool=tool, arguments=arguments, meta=meta,
                                       decision=decision, run_id=run_id, step_id=step_id, now=now)
        return ports.HeldCall(id=action.pk, public_id=str(action.public_id), url=action_url(action))

    def state(self, held_id: int) -> ports.HeldCallState | None:
        row = held_call_state(held_id)
        return ports.HeldCallState(*row) if row is not None else None

    def held_call(self, public_id: str) -> ports.HeldCall | None:
        action = ActionRequest.objects.filter(public_id=public_id).first()
        return ports.HeldCall(id=action.pk, public_id=str(action.public_id), url=action_url(action)) \
            if action is not None else None

    def claim(self, *, held_id: int, opened: journal_services.OpenedStep,
              meta: dict[str, Any] | None) -> bool:
        return claim_approved_action(action_id=held_id, opened=opened, meta=meta)

    def failed(self, *, run_id: int, step_id: int, mode: str) -> dict[str, Any]:
        return sagas.start_saga(run_id=run_id, step_id=step_id, mode=mode)

    def unwind(self, *, plan: int) -> dict[str, Any]:
        return sagas.unwind(plan_id=plan)

    def halting(self, *, plan: str) -> str | None:
        return sagas.halting(plan=plan)


def standing_words(action: ActionRequest, *, now: datetime | None = None) -> str:
    """Where a held call stands now, in one line, from its request and its steps (the held call's page and
    the list say the same): whether anyone waits on it, and for a call that was made, what came of it."""
    now = now or timezone.now()
    state, step = action.state, action.step
    if state == ActionRequest.State.USED:
        used = action.used_step
        if used is None:
            return f"Approved by {action.decided_by} and sent once."
        made = f"Sent by the agent after {action.decided_by}'s approval (step {used.number})"
        if used.status == "ok":
            return f"{made}; the server did it."
        if used.status in ("pending", "held"):
            return f"{made}; its outcome is not known yet."
        return f"{made}; the server refused it: {(used.error_message or 'no reason given')[:300]}"
    if state == ActionRequest.State.DENIED:
        return f"Denied by {action.decided_by}: nothing was sent."
    if state == ActionRequest.State.EXPIRED or action.expires_at <= now:
        return "Expired: nothing was sent; the agent must ask again."
    waiting = step is not None and step.status == "held"
    if state == ActionRequest.State.APPROVED:
        return (f"Approved by {action.decided_by}: the agent's waiting call goes through now." if waiting else
                f"Approved by {action.decided_by}; nobody waits on it now: the agent's next identical call "
                "goes through, once.")
    if waiting:
        return "Waiting for approval: the agent waits on it now."
    why = _NOT_WAITING.get(getattr(step, "held_end", ""), "its attempt was not sent")
    return f"Waiting for approval; the agent is not waiting ({why})."


# Why nobody waits on a pending held call, by how its attempt ended (`Step.held_end`).
_NOT_WAITING = {"told": "it was told to call again once approved", "hung_up": "it stopped waiting",
                "lost": "the Recorder holding its call stopped", "lapsed": "its attempt lapsed"}
