"""The mcp SDK's client, declaring what it is told to.

The Recorder declares to each upstream session the capabilities of the agent session it serves, so that a
server offers (and asks) exactly what it would of that agent directly."""

from dataclasses import dataclass

import mcp_types as types

from ..sdk import HookedClient, wrap_capabilities


@dataclass
class DeclaringClient(HookedClient):
    """The SDK's client, declaring to the server exactly the capabilities it is given in `declared` (the
    agent's own, for the requests relayed to it): the SDK on its own declares every elicitation mode and
    `roots.listChanged` whenever it has a callback for them."""

    declared: types.ClientCapabilities | None = None

    def session_built(self, session):
        declared = self.declared
        if declared is not None:
            def exactly(built):
                return lambda version: built(version).model_copy(
                    update={
                        "elicitation": declared.elicitation,
                        "sampling": declared.sampling,
                        "roots": declared.roots,
                    }
                )

            wrap_capabilities(session, exactly)
        return session
