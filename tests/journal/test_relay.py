"""The relay's own failures (issue 24, 7): when the Recorder cannot put a server's question to the agent,
the call in flight remembers why, so the advice on the server's refusal says it was the Recorder's failure,
not the server's rule."""

import anyio
import mcp_types as types

from journal.mcp import bridge, relay
from journal.mcp.failing import failed


class _Gone:
    """An agent's session whose stream broke."""

    protocol_version = "2025-11-25"

    async def send_request(self, *args, **kwargs):
        raise ConnectionResetError


def _ask(relayer, owner):
    request = types.ElicitRequest(params=types.ElicitRequestFormParams(
        message="Name?", requested_schema={"type": "object", "properties": {}}))
    return relayer._ask(owner, "everything", request, types.ElicitResult)


def test_a_question_the_recorder_could_not_put_is_its_own_failure_and_advised_so():
    relayer = relay.Relay(journal=None, bridge=bridge.Bridge())
    owner = ("agent", "session")

    async def main():
        with relayer.call(owner, None, None) as gone:  # no session to ask on, no bridge for it
            answered = await _ask(relayer, owner)
        with relayer.call(owner, _Gone(), None) as broken:
            broken_answer = await _ask(relayer, owner)
        return gone, answered, broken, broken_answer

    gone, answered, broken, broken_answer = anyio.run(main)
    assert isinstance(answered, types.ErrorData) and gone.failed == "the agent's session had ended"
    assert isinstance(broken_answer, types.ErrorData)
    assert broken.failed == "the agent could not be asked (ConnectionResetError)"
    advice = failed("unknown", relay_failed=gone.failed)
    assert advice.action == "ask_user" and "the Recorder's failure, not the server's rule" in advice.why
