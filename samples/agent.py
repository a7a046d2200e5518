"""A scripted agent: a real MCP client that replays the Globex story through the Recorder.

    python -m samples.agent --url http://localhost:8000/mcp/ --token agt_…

sales-bot, acting for Dana, reads deal D-881, marks it Won, books a kickoff with Globex, and emails their
buyer. The first two can be undone; the email cannot. In the demo (`DEMO_STORY`) it also marks Globex a
customer
on the support desk through the desk's screens, which the desk takes back through its own screens.
"""

import argparse
import contextlib

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

RUN_ID = "globex-kickoff"

STORY = [
    ("crm__get_deal", {"deal_id": "D-881"}),
    ("crm__update_deal", {"deal_id": "D-881", "stage": "Won"}),
    (
        "calendar__create_event",
        {
            "title": "Kickoff with Globex",
            "start": "2026-12-04T15:00:00+00:00",
            "attendees": ["dana@acme.example", "buyer@globex.example", "cto@globex.example"],
        },
    ),
    (
        "mail__send_email",
        {
            "to": "buyer@globex.example",
            "subject": "Welcome aboard, Globex",
            "body": "Thanks for choosing us. Your kickoff is booked for Dec 4.",
        },
    ),
]

# The demo's telling: one change through an app's screens (`via: "ui"`) before the email.
DEMO_STORY = [*STORY[:3], ("desk__edit_record", {"id": "C-77", "status": "Customer"}), *STORY[3:]]


@contextlib.asynccontextmanager
async def connect(url: str, token: str):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
            yield client


AWAITS_APPROVAL = "awaits approval at "


def advised_pause(result, longest: float) -> float:
    """How long to wait before asking again: what the Recorder advised (`retryAfter`), at most `longest`."""
    journal = (result.meta or {}).get("hatp/journal") if isinstance(result.meta, dict) else None
    advice = journal.get("recovery") if isinstance(journal, dict) else None
    after = advice.get("retryAfter") if isinstance(advice, dict) else None
    return min(float(after) if isinstance(after, int | float) else longest, longest)


async def replay(url: str, token: str, *, run_id: str = RUN_ID, say=print, patient: bool = False,
                 story=STORY, longest_pause: float = 30.0) -> None:
    """Tell the story (or the part of it given). A call an autonomy policy holds waits briefly for approval
    inside the call; a `patient` agent, told it awaits approval, makes the same call again after the pause
    the Recorder advised (at most `longest_pause` seconds) until it is decided: once approved, it goes
    through once."""
    async with connect(url, token) as client:
        for name, arguments in story:
            while True:
                result = await client.call_tool(name, arguments, meta={"hatp/journal": {"runId": run_id}})
                text = result.content[0].text if result.content else ""
                shown = " ".join(text.split())  # a server's JSON answer, on one line
                say(f"  {name}: {'ERROR ' if result.is_error else ''}"
                    f"{shown if len(shown) <= 160 else shown[:159] + '…'}")
                if not (patient and result.is_error and AWAITS_APPROVAL in text):
                    break
                await anyio.sleep(advised_pause(result, longest_pause))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://localhost:8000/mcp/")
    parser.add_argument("--token", required=True)
    parser.add_argument("--run-id", default=RUN_ID)
    args = parser.parse_args()
    anyio.run(lambda: replay(args.url, args.token, run_id=args.run_id))


if __name__ == "__main__":
    main()
