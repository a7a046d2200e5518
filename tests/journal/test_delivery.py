"""Whether a handshake agent got its answer: the two halves of a call report in either order."""

import anyio

from journal.mcp.delivery import GONE, Deliveries, call_id


def lost_calls():
    lost = []

    async def record(journaled, why):
        lost.append((journaled, why))

    return lost, Deliveries(lost=record)


def test_an_answer_sent_is_not_lost_and_is_forgotten():
    lost, deliveries = lost_calls()

    async def main():
        await deliveries.answered("s", 1, "first")
        await deliveries.finished("s", "1", delivered=True)
        # The agent may use the same id again: the first call's outcome is not the second's.
        await deliveries.finished("s", "1", delivered=False)
        await deliveries.answered("s", 1, "second")

    anyio.run(main)
    assert lost == [("second", GONE)]


def test_a_hang_up_after_the_answer_was_journaled_marks_that_answer():
    lost, deliveries = lost_calls()

    async def main():
        await deliveries.answered("s", "a", "journaled")
        await deliveries.answered("t", "a", "other session")
        await deliveries.finished("s", "a", delivered=False)

    anyio.run(main)
    assert lost == [("journaled", GONE)]


def test_an_ended_session_is_forgotten():
    lost, deliveries = lost_calls()

    async def main():
        await deliveries.finished("s", "1", delivered=False)
        deliveries.forget("s")
        await deliveries.answered("s", 1, "after the session ended")

    anyio.run(main)
    assert lost == []


def test_only_a_tools_call_request_has_a_call_id():
    assert call_id(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}') == "7"
    assert call_id(b'{"jsonrpc": "2.0", "id": "x", "method": "tools/call"}') == "x"
    assert call_id(b'{"jsonrpc": "2.0", "method": "tools/call"}') is None  # a notification
    assert (
        call_id(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": "tools/call"}}') is None
    )
    assert call_id(b'{"tools/call": ') is None
    assert call_id(b'[{"id": 1, "method": "tools/call"}]') is None
