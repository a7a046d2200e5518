"""An agent that names another agent's `Mcp-Session-Id` is answered 404, and nothing of that session moves:
its calls are not cancelled, it is not ended, and its record does not say its agent did either (issue 22,
finding 4)."""

import sys
from pathlib import Path

import anyio
import httpx2
import pytest

from journal import services
from journal.models import AgentSession, ChainEntry, Step

from .helpers import settle

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "slow_stdio_server.py")]
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
ACCEPT = "application/json, text/event-stream"


@pytest.fixture
def agents(recorder, dana, tmp_path):
    ledger = tmp_path / "ledger"
    services.refresh_catalogue(
        server=services.register_tool_server(name="slow", command=" ".join([*SLOW, str(ledger)])))
    _, mine = services.create_agent(name="mine", on_behalf_of=dana)
    _, other = services.create_agent(name="other", on_behalf_of=dana)
    return mine, other, ledger


async def opened_session(http, base: str, token: str) -> dict:
    opened = await http.post(f"{base}/mcp/", json=INITIALIZE, headers={"Authorization": f"Bearer {token}"})
    headers = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
    await http.post(f"{base}/mcp/", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                    headers={**headers, "Authorization": f"Bearer {token}"})
    return headers


def test_another_agent_cannot_cancel_a_call_in_my_session(recorder, agents):
    mine, other, ledger = agents
    base = recorder.base

    async def main():
        async with httpx2.AsyncClient(headers={"Accept": ACCEPT}, timeout=30) as http:
            headers = await opened_session(http, base, mine)
            me = {**headers, "Authorization": f"Bearer {mine}"}
            them = {**headers, "Authorization": f"Bearer {other}"}
            call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "slow__wait", "arguments": {"seconds": 2}}}
            answers = {}

            async def make_call():
                answers["call"] = await http.post(f"{base}/mcp/", headers=me, json=call)

            async with anyio.create_task_group() as group:
                group.start_soon(make_call)
                await anyio.sleep(1.0)  # the server has the call
                answers["cancel"] = await http.post(f"{base}/mcp/", headers=them, json={
                    "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
            return answers

    answers = anyio.run(main)
    settle(recorder)
    assert answers["cancel"].status_code == 404
    assert "waited 2" in answers["call"].text
    assert Step.objects.get().status == "ok" and "cancelled" not in ledger.read_text()


def test_another_agent_cannot_end_my_session(recorder, agents):
    mine, other, _ = agents
    base = recorder.base

    async def main():
        async with httpx2.AsyncClient(headers={"Accept": ACCEPT}, timeout=30) as http:
            headers = await opened_session(http, base, mine)
            ended = await http.delete(f"{base}/mcp/", headers={**headers, "Authorization": f"Bearer {other}"})
            listed = await http.post(f"{base}/mcp/", headers={**headers, "Authorization": f"Bearer {mine}"},
                                     json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            return ended, listed, headers["Mcp-Session-Id"]

    ended, listed, session_id = anyio.run(main)
    settle(recorder)
    assert ended.status_code == 404
    assert listed.status_code == 200 and "slow__wait" in listed.text
    assert AgentSession.objects.filter(session_id=session_id).exists()
    assert not ChainEntry.objects.filter(event__in=["session_ended", "run_ended"]).exists()
