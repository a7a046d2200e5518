"""A call an autonomy policy holds for approvers: the Recorder waits for their decision, up to the policy's
time, and lets the call through once with exactly the arguments and `_meta` the approval covers."""

import asyncio
import contextlib

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from .. import idempotency, ports, recovery, services
from ..models import Agent
from .context import approved_meta, held_call_meta
from .failing import failed
from .journal_thread import JournalThread

HOLD_POLL_SECONDS = 0.5  # how often a held call looks for the approvers' decision


async def hold(journal: JournalThread, agent: Agent, opened: services.OpenedStep,
               progress) -> tuple[tuple[str, recovery.Advice] | None, dict | None]:
    """Wait for approvers to decide on a held call, up to the policy's time. Returns (None, the `_meta`
    to send) once the call is approved and released (an approval lets exactly one call through, with the
    arguments and `_meta` it covers), else ((what to tell the agent, what to advise it), None). Waiting reads
    the request's
    state (not on the journal thread: reads never queue behind writes)."""
    gate = ports.gate()
    asked = opened.policy.get("hold") or {}
    meta = held_call_meta(opened.request_meta)
    held = await journal.run(
        gate.hold, agent=agent, server=opened.server, tool=opened.tool, arguments=opened.arguments, meta=meta,
        decision=opened.policy, run_id=opened.run_id, step_id=opened.step_id, now=timezone.now())
    url = held.url
    await journal.run(services.held_step_alive, step_id=opened.step_id, now=timezone.now(),
                      held_call=held.public_id)
    read = sync_to_async(lambda: gate.state(held.id))
    timeout = float(asked.get("askTimeout") or ports.DEFAULT_HOLD_SECONDS)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    beat = loop.time() + ports.HOLD_BEAT_SECONDS
    while True:
        standing = await read()
        waited = timeout - max(deadline - loop.time(), 0.0)
        if standing.state == ports.HeldState.APPROVED and await journal.run(
                gate.claim, held_id=held.id, step_id=opened.step_id):
            secret = idempotency.secret(settings.SECRET_KEY)
            sent = approved_meta(meta, idempotency.recorder_key(secret, "held-call", held.public_id))
            await journal.run(services.release_held_step, opened=opened, now=timezone.now(), approval={
                "action": held.public_id, "approvedBy": standing.decided_by, "meta": sent})
            return None, sent
        if standing.state == ports.HeldState.DENIED:
            message = (f"Not done: {standing.decided_by} denied this call: “{standing.decision_reason}”. "
                       f"Nothing was sent.")
            held = "denied"
        elif standing.state == ports.HeldState.USED:
            message = f"Not done: the approval at {url} already let an identical call through; ask again."
            held = "lapsed"
        elif standing.state == ports.HeldState.EXPIRED or standing.expires_at <= timezone.now():
            message = f"Not done: the approval request at {url} expired. Make the call again to ask anew."
            held = "lapsed"
        elif loop.time() >= deadline:
            message = (f"Not done yet: this call awaits approval at {url} ({opened.policy.get('reason')}) "
                       "Make the same call again, with the same arguments, once it is approved.")
            held = "waiting"
        else:
            if progress is not None:
                with contextlib.suppress(Exception):  # a client that went away must not end the hold
                    await progress(waited, timeout, f"Waiting for approval: {url}")
            if loop.time() >= beat:  # still waiting on it: the reconciler leaves this step alone
                beat = loop.time() + ports.HOLD_BEAT_SECONDS
                await journal.run(services.held_step_alive, step_id=opened.step_id, now=timezone.now())
            await asyncio.sleep(HOLD_POLL_SECONDS)
            continue
        advice = failed("policy", opened.traits, held=held)
        await journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now(),
                          advice=advice.as_wire())
        return (message, advice), None
