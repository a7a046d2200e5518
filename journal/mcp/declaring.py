"""The mcp SDK's client, declaring what it is told to.

The Recorder declares to each upstream session the capabilities of the agent session it serves, so that a
server offers (and asks) exactly what it would of that agent directly."""

from dataclasses import dataclass

import mcp_types as types
from mcp import Client


@dataclass
class DeclaringClient(Client):
    """The SDK's client, declaring to the server exactly the capabilities it is given in `declared` (the
    agent's own, for the requests relayed to it): the SDK on its own declares every elicitation mode and
    `roots.listChanged` whenever it has a callback for them."""

    declared: types.ClientCapabilities | None = None

    async def _build_session(self, exit_stack):
        session = await super()._build_session(exit_stack)
        if self.declared is not None:
            built, declared = session._build_capabilities, self.declared

            def exactly(version: str) -> types.ClientCapabilities:
                return built(version).model_copy(update={
                    "elicitation": declared.elicitation, "sampling": declared.sampling, "roots": declared.roots})

            session._build_capabilities = exactly
        return session
