"""The records of handshake sessions (`journal.services.agent_sessions`): written once as `initialize` is
answered, found by any process while in use, gone when the agent ends the session or it goes idle."""

from datetime import timedelta

import pytest
from django.utils import timezone

from journal import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(dana):
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    return agent


def save(agent, session_id="s-1"):
    services.save_agent_session(session_id=session_id, agent_id=agent.pk, protocol_version="2025-11-25",
                                client_info={"name": "cli"}, capabilities={"roots": {}})


def test_a_session_is_found_while_in_use_and_gone_once_the_agent_ends_it(agent):
    save(agent)
    assert services.agent_session(session_id="s-1", used_since=None) == (
        agent.pk, "2025-11-25", {"name": "cli"}, {"roots": {}})
    services.forget_agent_session(session_id="s-1")
    assert services.agent_session(session_id="s-1", used_since=None) is None


def test_a_session_unused_for_too_long_is_not_found_and_is_forgotten(agent):
    save(agent)
    save(agent, "s-2")
    later = timezone.now() + timedelta(hours=1)
    services.touch_agent_session(session_id="s-2", now=later)
    assert services.agent_session(session_id="s-1", used_since=later - timedelta(minutes=30)) is None
    assert services.forget_idle_agent_sessions(idle_seconds=1800, now=later) == 1
    assert services.agent_session(session_id="s-2", used_since=None) is not None
