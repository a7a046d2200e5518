"""Opening an agent's call: the server found, an admin's recipe's read of the record made first
(`earlier`), the autonomy policy asked, and the intent journaled, in one job on the journal thread (two
when the Recorder's copy of the server was stale)."""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from .. import ports, services
from ..models import Agent
from ..upstream.client import Upstreams
from . import earlier as reads
from .context import recorder_error
from .failing import failed
from .journal_thread import ServerDirectory

logger = logging.getLogger(__name__)


def gated_step(*, servers: ServerDirectory, agent: Agent, server_name: str, tool: str, arguments: dict,
              key: str, request_meta: dict | None, now, earlier: dict | None = None,
              read_first: bool = True, client: str = "") -> services.OpenedStep | reads.NeedsRead | None:
    """Find the server, ask the policy gate and journal the intent (with the decision) in one job on the
    journal thread. The gate reads the tool's own declaration, never anything the agent sent. A call whose
    recipe reads the record first is not opened yet: the answer says so (`reads.NeedsRead`), and the
    caller comes back with what it read (`earlier`)."""
    server = servers.get(server_name)
    if server is None:
        return None
    server_name = server.name  # the agent may have called it by its alias: the record names the server
    recipe = reads.needs_read(server, tool)
    if recipe is not None and read_first and not reads.taken_by(recipe, arguments, earlier):
        return reads.NeedsRead(server=server, recipe=recipe)
    earlier = earlier if recipe is not None else None
    gate = ports.gate()

    def decide(declaration, retry_of=None):
        decision = not_held(gate.decide(agent_name=agent.name, server_name=server_name, tool=tool,
                                        declaration=declaration, retry_of=retry_of, team=agent.team_id),
                            agent, server, tool)
        if (why := reads.refused(earlier)) is not None:  # whatever the policies say
            return {**{k: v for k, v in (decision or {}).items() if k != "hold"}, "decision": "deny",
                    "reason": why, "capture": reads.touches_capture(earlier),
                    "statements": True}
        return decision

    return services.open_step(agent=agent, run_key=key, server=server, server_name=server_name, tool=tool,
                              arguments=arguments, request_meta=request_meta, now=now, decide=decide,
                              earlier=earlier, client=client)


def not_held(decision: dict | None, agent: Agent, server, tool: str) -> dict | None:
    """A decision to hold a call for approvers, refused instead when nobody should be asked: the server does
    not list the tool (a hostile agent's made-up calls would each email every approver), or the agent may
    not ask approvers (`Agent.asks_approvers`: off for one minted on the consent page by an account with no
    role, until an admin turns it on)."""
    if not decision or decision.get("decision") != "ask":
        return decision
    if server.tool(tool) is None:
        why = f"{server.name} does not list a tool named {tool}, so nobody was asked to approve it."
    elif not agent.asks_approvers:
        why = (f"This call would wait for approvers, and {agent.name} may not ask them (an admin can let it, "
               "on the agent's admin page), so nobody was asked.")
    else:
        return decision
    return {**{key: value for key, value in decision.items() if key != "hold"}, "decision": "deny",
            "reason": why, "notHeld": True}


async def open_call(journal, upstreams: Upstreams, begin: dict[str, Any], owner,
                    never_sent: Callable[[services.OpenedStep], None]):
    """Open a call's step (`gated_step(**begin)` on the journal thread), its record read first when an admin's
    recipe says so: by the server as the Recorder last knew it, so the usual call takes one trip to the
    journal; when that was stale, the journal says so (`reads.NeedsRead`) and the read is made then.
    An agent that cancels while the intent is being journaled leaves a step that was opened but never sent:
    `never_sent(opened)` closes it, so no step is left in flight for the reconciler to guess about."""
    known = journal.servers.known(begin["server_name"])
    recipe = reads.needs_read(known, begin["tool"]) if known is not None else None
    earlier = None
    if recipe is not None:
        earlier = await reads.before(upstreams, reads.NeedsRead(server=known, recipe=recipe),
                                     begin["arguments"], owner)
    opened = await _gated(journal, never_sent, **begin, earlier=earlier)
    if isinstance(opened, reads.NeedsRead):
        earlier = await reads.before(upstreams, opened, begin["arguments"], owner)
        opened = await _gated(journal, never_sent, **begin, earlier=earlier, read_first=False)
    return opened


async def _gated(journal, never_sent: Callable[[services.OpenedStep], None], **kwargs):
    """`gated_step(**kwargs)` on the journal thread, run to its end even when the agent cancels meanwhile
    (a queued job would otherwise be dropped, or a running one's step left open): the step it opened then
    goes to `never_sent`."""
    job = journal.submit(gated_step, **kwargs)
    try:
        return await asyncio.shield(job)
    except DatabaseError:  # its words (SQL, values) stay in the log: the agent hears what it means
        logger.exception("the intent of a call to %s could not be journaled", kwargs["server_name"])
        raise recorder_error(
            -32603, "Not sent: the Recorder could not journal this call (its database refused the write), "
            f"so nothing was sent to {kwargs['server_name']}. Try again later; if it happens again, tell "
            "whoever runs the Recorder.", reason="unavailable", advice=failed("transient")) from None
    except asyncio.CancelledError:
        def opened_then(done: asyncio.Future) -> None:
            if not done.cancelled() and done.exception() is None and isinstance(done.result(),
                                                                               services.OpenedStep):
                never_sent(done.result())

        job.add_done_callback(opened_then)
        raise
