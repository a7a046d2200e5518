"""Agent sessions on the initialize handshake: the one writer of their records, which any Recorder process
serves a session by (`journal.mcp.sessions`) and the worker forgets once idle (`journal.tasks`)."""

from datetime import datetime, timedelta
from typing import Any

from ..models import AgentSession
from ..record.canonical import to_ijson


def save_agent_session(*, session_id: str, agent_id: int, protocol_version: str, client_info: dict[str, Any],
                       capabilities: dict[str, Any]) -> None:
    """Write down a session as its `initialize` is answered (before the agent hears of it). What the agent
    said of itself is kept as the record keeps any text from outside (`to_ijson`: U+0000 and lone
    surrogates as U+FFFD, on every database)."""
    AgentSession.objects.update_or_create(session_id=session_id, defaults={
        "agent_id": agent_id, "protocol_version": protocol_version, "client_info": to_ijson(client_info),
        "capabilities": to_ijson(capabilities)})


def agent_session(*, session_id: str, used_since: datetime | None) -> tuple[int, str, dict, dict] | None:
    """(agent id, protocol version, client info, capabilities) of a session in use since `used_since`
    (any, when None), or None: unknown, ended, or gone idle."""
    sessions = AgentSession.objects.filter(session_id=session_id)
    if used_since is not None:
        sessions = sessions.filter(last_used_at__gte=used_since)
    return sessions.values_list("agent_id", "protocol_version", "client_info", "capabilities").first()


def touch_agent_session(*, session_id: str, now: datetime) -> None:
    """The session is still in use (written at most once a minute per process, not per request)."""
    AgentSession.objects.filter(session_id=session_id).update(last_used_at=now)


def forget_agent_session(*, session_id: str) -> None:
    """The agent ended the session (its DELETE): every process says "Session not found" from now."""
    AgentSession.objects.filter(session_id=session_id).delete()


def forget_idle_agent_sessions(*, idle_seconds: float, now: datetime) -> int:
    """Forget sessions unused for `idle_seconds`: no process serves them any more. Returns how many."""
    return AgentSession.objects.filter(last_used_at__lt=now - timedelta(seconds=idle_seconds)).delete()[0]
