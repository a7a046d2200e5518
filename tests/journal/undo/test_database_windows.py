"""A database's write window and an agent that hangs up (issue 45): a call cancelled while it waits for
another call's window, or while its own is being opened, leaves nothing held; the next call gets the
window at once."""

import asyncio
import threading

import pytest

from journal.mcp import earlier as earlier_reads
from journal.models import ToolServer
from journal.upstream import database, windows

from .databases import make_crm

WRITES = {"database": {"reading": {"kind": "rows", "statements": []}}}


@pytest.fixture
def server(tmp_path):
    path = make_crm(tmp_path / "crm.db")
    database.install(str(path), ["contacts"])
    return ToolServer(name="crm", database=str(path))


def test_a_call_cancelled_while_another_holds_the_window_leaves_nothing_held(server):
    async def main():
        busy = await earlier_reads.window(server, WRITES)
        waiting = asyncio.create_task(earlier_reads.window(server, WRITES))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # it waits for the other call's window, on the event loop
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        windows.release(busy)
        windows.release(await asyncio.wait_for(earlier_reads.window(server, WRITES), 5))

    asyncio.run(main())


def test_a_call_cancelled_while_its_window_is_being_opened_lets_it_go_once_opened(server):
    """Another process's window (here a thread's) holds the database: the call's own opening waits in a
    thread, is cancelled, opens when the other lets go, and is let go at once."""
    held = windows.opened(server.database)
    released = threading.Event()

    async def main():
        waiting = asyncio.create_task(earlier_reads.window(server, WRITES))
        await asyncio.sleep(0.3)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        threading.Timer(0.2, lambda: (windows.release(held), released.set())).start()
        later = await asyncio.wait_for(earlier_reads.window(server, WRITES), 10)
        assert released.is_set()
        windows.release(later)
        windows.release(await asyncio.wait_for(earlier_reads.window(server, WRITES), 5))

    asyncio.run(main())
