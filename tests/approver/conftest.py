import anyio
import pytest

from journal import services as journal_services
from journal.models import Run
from samples import agent as scripted
from tests.journal.helpers import register_samples, settle


@pytest.fixture
def globex(recorder, sample_servers, dana) -> Run:
    """The Globex story, told through the Recorder by sales-bot for Dana: read deal D-881, mark it Won,
    book the kickoff, email the buyer."""
    register_samples(sample_servers)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    anyio.run(lambda: scripted.replay(f"{recorder.base}/mcp/", token, say=lambda _: None))
    settle(recorder)
    return Run.objects.get(key=f"run:{scripted.RUN_ID}")
