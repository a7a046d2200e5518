"""A call an autonomy policy holds for approvers. The held call is a state machine in the database
(held → approved | denied | expired → sent once → its outcome; the approval side keeps the request), never a
loop the agent's request owns: the request waits only briefly (`RECORDER_HOLD_WAIT_SECONDS`, or the policy's
shorter time), then the agent is told the call awaits approval, where, and what to do (make the same call
again once it is approved: it then goes through once), and the attempt is closed as told. An agent that
stops waiting first is journaled as exactly that. Nothing the agent does to its own stream (stop reading it,
hang up) can hold up the bookkeeping: progress notifications are bounded, and an approval is claimed only
together with releasing a step that is still held (`PolicyGate.claim`), so an attempt the record says was
never sent never is."""

import asyncio
import contextlib
from typing import Any

import anyio
from anyio import get_cancelled_exc_class
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from .. import ports, services
from ..models import Agent
from ..record import idempotency
from ..undo import recovery
from . import earlier as earlier_reads
from .context import approved_meta, held_call_meta
from .failing import failed
from .journal_thread import JournalThread

HOLD_POLL_SECONDS = 0.5  # how often a held call looks for the approvers' decision
# The longest one progress notification may take to leave: an agent that stops reading its stream (or sends a
# token too large to go out quickly) gets no more of them, and the hold goes on without it.
PROGRESS_SEND_SECONDS = 1.0

Refusal = tuple[str, recovery.Advice, dict]  # what the agent is told, what it is advised, `hatp/journal` keys


def waits_for(policy: dict) -> float:
    """How long the agent's request waits for a decision: the policy's time, at most the Recorder's."""
    asked = float((policy.get("hold") or {}).get("askTimeout") or ports.DEFAULT_HOLD_SECONDS)
    return max(0.0, min(asked, float(settings.RECORDER_HOLD_WAIT_SECONDS)))


async def hold(journal: JournalThread, agent: Agent, opened: services.OpenedStep,
               progress) -> tuple[Refusal | None, dict | None]:
    """Wait briefly for approvers to decide on a held call. Returns (None, the `_meta` to send) once the call
    is approved and its step released (an approval lets exactly one call through, with the arguments and
    `_meta` it covers), else ((what to tell the agent, what to advise it, the held call's `hatp/journal`
    keys), None), with the attempt closed as never sent. Waiting reads the request's state off the journal
    thread (reads never queue behind writes)."""
    held = await open_hold(journal, agent, opened)
    if not isinstance(held, ports.HeldCall):
        return held, None
    return await decided(journal, opened, held, progress, waits_for(opened.policy))


async def approved(journal: JournalThread, upstreams, agent: Agent, opened: services.OpenedStep,
                   arguments: dict, owner, progress, *,
                   never_sent) -> tuple[Refusal | None, Any, dict | None]:
    """`hold`, then, once the call is approved and released, an admin's recipe reads the record again, as
    it is now (`earlier.again`): (refusal or None, the step as it goes on, the `_meta` to send). A cancel
    between the release and the send closes the step as never sent (`never_sent(opened)`)."""
    refusal, sent = await hold(journal, agent, opened, progress)
    if refusal is None:
        try:
            opened, refusal = await earlier_reads.again(journal, upstreams, opened, arguments, owner)
        except get_cancelled_exc_class():  # released, and cancelled before it was sent
            never_sent(opened)
            raise
    return refusal, opened, sent


async def open_hold(journal: JournalThread, agent: Agent, opened: services.OpenedStep, *,
                    task: bool = False) -> ports.HeldCall | Refusal:
    """The request the held call waits on (approvers told of it), or the refusal when it cannot be held
    (the agent has as many waiting as it may), with the attempt closed as never sent. `task`: the agent has
    it as a task (any Recorder process may take over the wait)."""
    gate = ports.gate()
    try:
        held = await journal.run(
            gate.hold, agent=agent, server=opened.server, tool=opened.tool, arguments=opened.arguments,
            meta=held_call_meta(opened.request_meta), decision=opened.policy, run_id=opened.run_id,
            step_id=opened.step_id, now=timezone.now())
    except ports.HoldRefused as refused:  # too many waiting already: nobody is asked, nothing is sent
        advice = failed("policy", opened.traits, held="too_many")
        await journal.run(services.refuse_step, opened=opened, message=refused.message, now=timezone.now(),
                          advice=advice.as_wire())
        return refused.message, advice, {}
    await journal.run(services.held_step_alive, step_id=opened.step_id, now=timezone.now(),
                      held_call=held.public_id, task=task)
    return held


async def decided(journal: JournalThread, opened: services.OpenedStep, held: ports.HeldCall, progress,
                  wait: float, *, agent_waits: bool = True) -> tuple[Refusal | None, dict | None]:
    """Wait up to `wait` seconds for the approvers' decision on `held` (`hold`). Cancelled, the agent stopped
    waiting (`agent_waits`) and the attempt is closed as such; for a held call the agent has as a task, it is
    this process that stops (a restart): the step stays held for another to take over (`held_tasks`)."""
    gate = ports.gate()
    meta = held_call_meta(opened.request_meta)
    secret = idempotency.secret(settings.SECRET_KEY)
    sent = approved_meta(meta, idempotency.recorder_key(secret, "held-call", held.public_id))
    read = sync_to_async(lambda: gate.state(held.id))
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + wait
    beat = began + ports.HOLD_BEAT_SECONDS
    try:
        while True:
            standing = await read()
            if standing.state == ports.HeldState.APPROVED:
                if await _claimed(journal, gate, held, opened, sent):
                    return None, sent
                standing = await read()  # its approvals lapsed (pending again), or the step is not held
            ended = _ended(standing, held, opened, timed_out=loop.time() >= deadline)
            if ended is not None:
                break
            if progress is not None and not await _told_progress(
                    progress, loop.time() - began, deadline - began, f"Waiting for approval: {held.url}"):
                progress = None  # the agent is not reading its stream: the hold goes on without it
            if loop.time() >= beat:  # still waiting on it: the reconciler leaves this step alone
                beat = loop.time() + ports.HOLD_BEAT_SECONDS
                await journal.run(services.held_step_alive, step_id=opened.step_id, now=timezone.now())
            await asyncio.sleep(HOLD_POLL_SECONDS)
    except get_cancelled_exc_class():
        if not agent_waits:
            raise
        # The agent stopped waiting (its client timed out and cancelled, or hung up). Submitted, not awaited:
        # the write runs on the journal thread whatever becomes of this task.
        waited = loop.time() - began
        journal.submit(services.refuse_step, opened=opened, now=timezone.now(),
                       held_end=ports.HeldEnd.HUNG_UP,
                       message=f"The agent stopped waiting after {waited:.0f} s; nothing was sent.",
                       advice=failed("policy", opened.traits, held="waiting").as_wire())
        raise
    message, held_end, state = ended
    advice = failed("policy", opened.traits, held=_ADVICE[held_end])
    await journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now(),
                      advice=advice.as_wire(), held_end=held_end)
    return (message, advice, {"heldCall": {"url": held.url, "state": state,
                                           "expiresAt": standing.expires_at.isoformat()}}), None


async def _claimed(journal: JournalThread, gate, held: ports.HeldCall, opened: services.OpenedStep,
                   sent: dict | None) -> bool:
    """Claim the approval and release the step, in one transaction on the journal thread. Shielded: once it
    has begun, whether it claimed is known here, so a cancel that comes meanwhile is handled on what it did
    (a released step that is then cancelled is journaled as cancelled before it was sent)."""
    with anyio.CancelScope(shield=True):
        return await journal.run(gate.claim, held_id=held.id, opened=opened, meta=sent)


# What the agent is advised, by how its attempt ended: stop (denied), ask again later (told), or now (lapsed).
_ADVICE = {ports.HeldEnd.DENIED: "denied", ports.HeldEnd.TOLD: "waiting", ports.HeldEnd.LAPSED: "lapsed"}


def _ended(standing: ports.HeldCallState, held: ports.HeldCall, opened: services.OpenedStep, *,
           timed_out: bool) -> tuple[str, str, str] | None:
    """How the wait ends now, if it does: (what the agent is told, how the attempt ended, the request's
    state in `heldCall`), or None to wait on."""
    url = held.url
    if standing.state == ports.HeldState.APPROVED:  # approved, and this attempt could not be released
        return (f"Not done: this attempt was closed before its approval came, so it was never sent. The "
                f"approval at {url} lets the same call through once: make it again.", ports.HeldEnd.LAPSED,
                "approved")
    if standing.state == ports.HeldState.DENIED:
        return (f"Not done: {standing.decided_by} denied this call: “{standing.decision_reason}”. "
                "Nothing was sent.", ports.HeldEnd.DENIED, "denied")
    if standing.state == ports.HeldState.USED:
        return (f"Not done: the approval at {url} already let an identical call through; ask again.",
                ports.HeldEnd.LAPSED, "used")
    if standing.state == ports.HeldState.EXPIRED or standing.expires_at <= timezone.now():
        return (f"Not done: the approval request at {url} expired. Make the call again to ask anew.",
                ports.HeldEnd.LAPSED, "expired")
    if timed_out:
        return (f"Not done yet: this call awaits approval at {url} ({opened.policy.get('reason')}) Nothing "
                "was sent. Make the same call again, with the same arguments, once it is approved: it then "
                "goes through once.", ports.HeldEnd.TOLD, standing.state)
    return None


async def _told_progress(progress, done: float, total: float, message: str) -> bool:
    """Send one progress notification, within PROGRESS_SEND_SECONDS; False when it could not leave in time
    (the agent does not read its stream). A client that went away must not end the hold."""
    with anyio.move_on_after(PROGRESS_SEND_SECONDS) as scope, contextlib.suppress(Exception):
        await progress(done, total, message)
    return not scope.cancelled_caught
