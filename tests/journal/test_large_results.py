"""Large results: up to RECORDER_MAX_RESULT_BYTES an answer reaches every kind of agent from every kind of
server (no event-size cap on the way), and is stored once, in the run's record; over it, the agent gets a
tool error naming the limit and the step keeps the size and SHA-256 of what the server sent."""

import hashlib
import json
import sys
from pathlib import Path

import pytest
from django.test import Client as WebClient

from journal import services
from journal.models import Step
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server

from .helpers import register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)

SLOW = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "slow_stdio_server.py")]
FIVE_MB = 5 * 1024 * 1024
SERVERS = ["stateless-http", "handshake-json", "handshake-sse", "stdio"]


@pytest.fixture
def upstream(request, sample_servers, tmp_path):
    """A tool server with a `blob` tool, named `big`: the sample server on the stateless 2026-07-28 protocol
    (the direct path), a 2025 server answering with JSON or with event streams (the SDK's path), or stdio."""
    kind = request.param
    if kind == "stateless-http":
        register_samples(sample_servers, names=("legacy",))
        services.refresh_catalogue(
            server=services.register_tool_server(name="big", url=sample_servers.url("legacy"))
        )
        yield kind
    elif kind == "stdio":
        services.refresh_catalogue(server=services.register_tool_server(
            name="big", command=" ".join([*SLOW, str(tmp_path / "ledger")])))
        yield kind
    else:
        with ServerThread(
            handshake_server.build_app(json_response=kind == "handshake-json"), free_port()
        ) as server:
            services.refresh_catalogue(
                server=services.register_tool_server(name="big", url=f"{server.base}/mcp")
            )
            yield kind


@pytest.fixture
def token(dana):
    return services.create_agent(name="bot", on_behalf_of=dana)[1]


def blob_through(recorder, token: str, size: int, mode: str):
    async def script(client):
        return await client.call_tool("big__blob", {"size": size})

    return run_agent(recorder, token, script, mode=mode)


@pytest.mark.parametrize("upstream", SERVERS, indirect=True)
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_five_megabyte_result_reaches_the_agent_and_is_stored_once(recorder, token, upstream, mode):
    result = blob_through(recorder, token, FIVE_MB, mode)
    assert not result.is_error and result.content[0].text == "x" * FIVE_MB
    step = Step.objects.get()
    assert (step.status, step.result_storage, step.result) == ("ok", "journal", None)
    entry = step.run.entries.get(seq=step.result_seq)
    assert entry.data["result"]["content"][0]["text"] == "x" * FIVE_MB
    kept = json.dumps(entry.data["result"], separators=(",", ":"), ensure_ascii=False).encode()
    assert (step.result_size, step.result_sha256) == (len(kept), hashlib.sha256(kept).hexdigest())


@pytest.mark.parametrize("upstream", SERVERS, indirect=True)
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_answer_over_the_limit_is_a_tool_error_and_the_step_keeps_its_size_and_digest(
        recorder, token, upstream, mode):
    recorder.app.recorder.upstreams.max_answer_bytes = 200_000
    try:
        result = blob_through(recorder, token, 300_000, mode)
    finally:
        recorder.app.recorder.upstreams.max_answer_bytes = 32 * 1024 * 1024
    assert result.is_error
    message = result.content[0].text
    assert "over the Recorder's limit of 200000 bytes (RECORDER_MAX_RESULT_BYTES)" in message
    assert "The server may have acted; do not repeat the call blindly." in message
    step = Step.objects.get()
    assert (step.status, step.result_storage, step.result, step.error_message) == (
        "undelivered",
        "dropped",
        None,
        message,
    )
    assert (
        300_000 < step.result_size < 700_000
        and len(step.result_sha256) == 64
        and step.result_sha256 in message
    )  # stdio: text and structured
    assert step.reversibility == "unknown" and "size limit" in step.undo_problems[0]
    entry = step.run.entries.get(event="result")
    assert (entry.data["result"], entry.data["resultDropped"], entry.data["resultSize"]) == (
        None,
        True,
        step.result_size,
    )
    assert step.run.failed_count == 1


def test_over_stdio_the_digest_is_of_the_line_the_server_wrote(recorder, token, tmp_path):
    """Over stdio the answer is one line, read in chunks and never held whole once it runs over the limit;
    the step's size and digest are of the bytes of that line (a copy of the server's output, kept by `tee`,
    says what they were)."""
    copy = tmp_path / "stdout"
    command = f"sh -c '{' '.join(SLOW)} {tmp_path / 'ledger'} | tee {copy}'"
    services.refresh_catalogue(server=services.register_tool_server(name="big", command=command))
    recorder.app.recorder.upstreams.max_answer_bytes = 100_000
    try:
        result = blob_through(recorder, token, 2_000_000, "auto")
        small = blob_through(recorder, token, 10, "auto")  # the session goes on after the line it dropped
    finally:
        recorder.app.recorder.upstreams.max_answer_bytes = 32 * 1024 * 1024
    assert result.is_error and "over the Recorder's limit of 100000 bytes" in result.content[0].text
    assert not small.is_error and small.content[0].text == "x" * 10
    line = max(copy.read_bytes().split(b"\n"), key=len)
    step = Step.objects.filter(status="undelivered").get()
    assert (step.result_size, step.result_sha256) == (len(line), hashlib.sha256(line).hexdigest())


@pytest.mark.parametrize("upstream", ["stateless-http"], indirect=True)
def test_pages_and_the_api_show_a_large_results_size_and_serve_it_as_a_download(
    recorder, token, upstream, on_call
):
    blob_through(recorder, token, 200_000, "auto")
    blob_through(recorder, token, 10, "auto")
    big, small = Step.objects.order_by("run_id", "number")
    web = WebClient()
    listing = f"/api/runs/{big.run.public_id}/steps/"
    assert web.get(listing).status_code == 401  # not signed in: no steps, no results
    assert web.get(f"{listing}1/result").status_code == 401
    web.force_login(on_call)
    item = next(
        i
        for i in web.get(f"/api/runs/{big.run.public_id}/steps/").json()["items"]
        if i["number"] == big.number
    )
    assert (item["result"], item["resultStorage"], item["resultSize"]) == (None, "journal", big.result_size)
    download = web.get(item["resultUrl"])
    assert download.status_code == 200 and "attachment" in download["Content-Disposition"]
    assert download.json()["content"][0]["text"] == "x" * 200_000
    small_item = web.get(f"/api/runs/{small.run.public_id}/steps/").json()["items"][-1]
    assert small_item["resultStorage"] == "inline" and small_item["result"]["content"][0]["text"] == "x" * 10
    page = web.get(f"/runs/{big.run.public_id}/").content.decode()
    assert f'<a href="{item["resultUrl"]}" download>Answer (195.4\xa0KB)</a>' in page
    assert web.get(f"/api/runs/{big.run.public_id}/steps/99/result").status_code == 404
