"""The one client of tool servers (`journal.upstream.client.Upstreams`), against the real sample servers:
a result comes back as the server sent it, and every failure is one `ToolServerError` that says whether it
is worth repeating and whether the server may have acted."""

import anyio
import pytest

from journal.upstream.client import Endpoint, ToolServerError, Upstreams
from tests.conftest import free_port


def legacy(sample_servers) -> Endpoint:
    return Endpoint("legacy", "http", sample_servers.url("legacy"), "")


async def call(endpoint: Endpoint, name: str, arguments: dict, *, timeout: float = 10.0, direct: bool = True):
    async with Upstreams(timeout=timeout, direct=direct) as upstreams:
        return await upstreams.call_tool(endpoint, name, arguments)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "session"])
def test_a_result_comes_back_as_the_server_sent_it(sample_servers, direct):
    result = anyio.run(lambda: call(legacy(sample_servers), "echo", {"text": "hello"}, direct=direct))
    assert result.get("isError") is not True and result["structuredContent"] == {"text": "hello"}


def test_a_servers_tool_error_is_an_answer_not_a_failure(sample_servers):
    result = anyio.run(lambda: call(legacy(sample_servers), "no_such_tool", {}))
    assert result.get("isError") is True


def test_a_server_nobody_listens_on_failed_before_anything_was_sent():
    nowhere = Endpoint("nowhere", "http", f"http://127.0.0.1:{free_port()}/mcp", "")
    with pytest.raises(ToolServerError) as failed:
        anyio.run(lambda: call(nowhere, "echo", {"text": "x"}, timeout=5))
    assert failed.value.transient and not failed.value.may_have_acted
    assert "nowhere" in failed.value.message


def test_a_server_that_never_answers_times_out_and_may_have_acted(sample_servers):
    sample_servers.set_mode("legacy", "act_then_hang")
    try:
        with pytest.raises(ToolServerError) as failed:
            anyio.run(lambda: call(legacy(sample_servers), "echo", {"text": "x"}, timeout=1.5))
    finally:
        sample_servers.set_mode("legacy", "normal")
    assert failed.value.may_have_acted and failed.value.failure_class == "transient"


@pytest.mark.parametrize(("mode", "failure_class"), [("error_5xx", "transient"), ("garbage", "unknown")])
def test_a_server_that_answers_nonsense_is_a_failure_of_its_class(sample_servers, mode, failure_class):
    sample_servers.set_mode("legacy", mode)
    try:
        with pytest.raises(ToolServerError) as failed:
            anyio.run(lambda: call(legacy(sample_servers), "echo", {"text": "x"}, timeout=5))
    finally:
        sample_servers.set_mode("legacy", "normal")
    assert failed.value.failure_class == failure_class, failed.value.message
