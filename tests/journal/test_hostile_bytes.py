"""Issue 43, finding 5: U+0000 (which PostgreSQL stores neither in text nor in jsonb) in what an agent sends,
in a server's answer, and in the agent's answers to a server's elicitation and sampling, through the real
Recorder, on SQLite and again on PostgreSQL. The rule, the same on both databases: a call whose arguments
or `_meta` the record cannot keep exactly is refused before anything is sent (as for any value that is not
I-JSON); what was said after anything was sent (answers) is relayed exactly and recorded with U+0000 as
U+FFFD, in what is stored and in what is hashed, so the outcome is journaled and the run verifies."""

import json

import mcp_types as types
import pytest
from django.utils import timezone
from mcp import MCPError

from journal import services
from journal.models import Run, Step
from tests.conftest import ServerThread, free_port
from tests.fixtures import conformance_server

from .helpers import post_stateless_call, run_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
# What a database says when it refuses a value: none of it may reach an agent.
DATABASE_WORDS = ("psycopg", "PostgreSQL", "SQL", "CONTEXT", "NUL (0x00)", "IntegrityError", "DataError")


@pytest.fixture
def conf(recorder, dana):
    with ServerThread(conformance_server.build_app(), free_port()) as upstream:
        services.refresh_catalogue(server=services.register_tool_server(
            name="conf", url=f"http://localhost:{upstream.port}/mcp"))
        yield services.create_agent(name="nul-bot", on_behalf_of=dana)[1]


def said(result) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


def test_a_nul_in_the_agents_arguments_is_refused_before_anything_is_sent_and_the_run_goes_on(recorder, conf):
    asked = []

    async def sample(context, params):
        asked.append(params)
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="ok"),
                                         model="m", stop_reason="endTurn")

    async def script(client):
        refused = await client.call_tool("conf__test_sampling", {"prompt": "two\x00words"})
        keyed = await client.call_tool("conf__test_sampling", {"prompt": "x", "\x00": 1})
        after = await client.call_tool("conf__test_simple_text", {})
        return refused, keyed, after

    refused, keyed, after = run_agent(recorder, conf, script, mode="legacy", sampling_callback=sample)
    for result in (refused, keyed):
        text = said(result)
        assert result.is_error and "U+0000" in text and "Nothing was journaled or sent to conf" in text, text
        assert not any(word in text for word in DATABASE_WORDS), text
    assert asked == []  # the server never saw the call: it would have asked the agent's model
    assert not after.is_error
    assert list(Step.objects.values_list("tool", "status")) == [("test_simple_text", "ok")]
    assert services.verify_run(run=Run.objects.get()).ok


def test_a_nul_on_the_stateless_protocol_gets_the_same_answer(recorder, conf):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "conf__test_simple_text", "arguments": {"note": "a\x00b"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "x": "\x00"}}})
    response = post_stateless_call(recorder, conf, "conf__test_simple_text", body)
    assert response.status_code == 200
    text = response.json()["result"]["content"][0]["text"]
    assert "U+0000" in text and not any(word in text for word in DATABASE_WORDS), text
    assert Step.objects.count() == 0


def test_a_nul_in_what_the_server_and_the_agent_answer_is_relayed_exactly_and_journaled(recorder, conf):
    """The agent's model answers the server's sampling request with a NUL, which the server echoes in its
    result; the agent answers an elicitation with one. Both calls end ok, their outcome and the
    relayed answers on the record with U+FFFD, the agent got exactly what the server said, and the run's
    next call is journaled as usual."""

    async def sample(context, params):
        return types.CreateMessageResult(role="assistant", model="m", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text="four\x00five"))

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"username": "ada\x00", "email": "a@example.com"})

    async def script(client):
        sampled = await client.call_tool("conf__test_sampling", {"prompt": "2+2?"})
        elicited = await client.call_tool("conf__test_elicitation", {"message": "who?"})
        after = await client.call_tool("conf__test_simple_text", {})
        return sampled, elicited, after

    sampled, elicited, after = run_agent(recorder, conf, script, mode="legacy", sampling_callback=sample,
                                         elicitation_callback=elicit)
    assert said(sampled) == "LLM response: four\x00five"  # relayed exactly
    assert not elicited.is_error and not after.is_error
    steps = list(Step.objects.order_by("number"))
    assert [(step.tool, step.status) for step in steps] == [
        ("test_sampling", "ok"), ("test_elicitation", "ok"), ("test_simple_text", "ok")]
    assert "LLM response: four\ufffdfive" in json.dumps(steps[0].result, ensure_ascii=False)
    run = Run.objects.get()
    relayed = [entry.data for entry in run.entries.filter(event="relayed").order_by("seq")]
    assert [entry["method"] for entry in relayed] == ["sampling/createMessage", "elicitation/create"]
    assert relayed[0]["answer"]["content"]["text"] == "four\ufffdfive"
    assert relayed[1]["answer"]["content"]["username"] == "ada\ufffd"
    assert services.verify_run(run=run).ok


def test_what_a_server_and_a_client_say_outside_any_result_is_kept_the_same_way(recorder, dana):
    """A tool's description and a JSON-RPC error's message from the server with U+0000, and the agent's
    clientInfo at initialize with U+0000: the server is registered, the failed call is journaled
    with the server's words (U+FFFD for what cannot be kept), the agent hears no database's words, and the
    run verifies."""
    import sys
    from pathlib import Path

    import httpx2

    deep = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "deep_stdio_server.py")]
    server = services.refresh_catalogue(
        server=services.register_tool_server(name="deep", command=" ".join(deep)))
    assert not server.catalogue_error
    assert server.tool("spoil")["description"] == "Fail, saying \ufffd."
    token = services.create_agent(name="bot", on_behalf_of=dana)[1]
    opened = httpx2.post(f"{recorder.base}/mcp/", timeout=30, headers={
        "authorization": f"Bearer {token}", "accept": "application/json, text/event-stream",
        "content-type": "application/json"},
        content=json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {"x\x00": {}},
            "clientInfo": {"name": "bot\x00", "version": "1\x00"}}}).encode())
    assert opened.status_code == 200, opened.text

    async def script(client):
        with pytest.raises(MCPError) as refused:
            await client.call_tool("deep__spoil", {})
        return refused.value

    refused = run_agent(recorder, token, script)
    text = str(refused)  # the server's own error, relayed
    assert refused.error.message == "bad\x00thing" and not any(word in text for word in DATABASE_WORDS), text
    step = Step.objects.get(tool="spoil")
    assert step.status == "error" and "bad\ufffdthing" in step.error_message
    assert services.verify_run(run=step.run).ok


@pytest.mark.parametrize("mode", ["legacy", "stateless"])
def test_a_write_the_database_refuses_before_the_call_reaches_the_agent_in_the_recorders_words(
        recorder, conf, monkeypatch, mode):
    """Whatever else a database may refuse: its text (SQL, the values, CONTEXT) stays in the Recorder's log;
    the agent hears that nothing was sent, and why, in words it can act on."""
    from django.db import DataError

    from journal.mcp import opening

    def refused(**_):
        raise DataError('unsupported Unicode escape sequence\nCONTEXT: JSON data, line 1: {"prompt": "two...')

    monkeypatch.setattr(opening.services, "open_step", refused)
    if mode == "stateless":
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "conf__test_simple_text", "arguments": {},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}})
        error = post_stateless_call(recorder, conf, "conf__test_simple_text", body).json()["error"]
    else:
        async def script(client):
            with pytest.raises(MCPError) as caught:
                await client.call_tool("conf__test_simple_text", {})
            return caught.value.error.model_dump()

        error = run_agent(recorder, conf, script, mode="legacy")
    assert error["message"].startswith("Not sent: the Recorder could not journal this call"), error
    assert "nothing was sent to conf" in error["message"] and error["data"]["reason"] == "unavailable"
    assert not any(word in json.dumps(error) for word in DATABASE_WORDS + ("Unicode escape",)), error


def test_an_undo_bound_from_an_answer_the_record_cannot_keep_exactly_is_not_prepared():
    """A compensation bound from a server's answer with U+0000 (the id of what it created): the record
    keeps U+FFFD, so an undo sent from the record would name another thing. The step says so, and holds no
    compensation to send."""
    from journal.undo.outcomes import undo_facts

    tool = {"name": "create", "inputSchema": {"type": "object"}, "annotations": {"recovery": {
        "strategy": "compensation", "compensatingOperation": {
            "operationId": "delete", "parameters": {"id": "$response.body#/id"}}}}}
    facts = undo_facts(tool_def=tool, catalogue={"create", "delete"}, receipt_keys={}, arguments={},
                       result={"structuredContent": {"id": "a\x00b"}}, finished=timezone.now())
    assert facts["compensation_arguments"] is None, facts
    problems = facts["undo_problems"]
    assert any("cannot be kept exactly" in problem and "U+0000" in problem for problem in problems), problems
    fine = undo_facts(tool_def=tool, catalogue={"create", "delete"}, receipt_keys={}, arguments={},
                      result={"structuredContent": {"id": "ab"}}, finished=timezone.now())
    assert fine["compensation_arguments"] == {"id": "ab"}


def test_a_server_whose_tools_agents_would_see_named_over_64_characters_is_warned_of_at_registration(db):
    """Model APIs refuse a tool named over 64 characters, and frameworks then fail on the whole list: the
    registration says which names are too long and how short the server's name (their prefix) must be."""
    import io
    import sys
    from pathlib import Path

    from django.core.management import call_command

    deep = [sys.executable, str(Path(__file__).resolve().parent.parent / "fixtures" / "deep_stdio_server.py")]
    err = io.StringIO()
    call_command("add_tool_server", "a-very-long-server-name-that-some-admins-pick-for-deep-tools",
                 "--command", " ".join(deep), stdout=io.StringIO(), stderr=err)
    said = err.getvalue()
    assert "5 of a-very-long-server-name" in said and "longer than the 64 characters" in said, said
    assert "give it an alias of at most 57 characters" in said
    server = services.register_tool_server(name="deep", command=" ".join(deep))
    assert services.names_too_long(services.refresh_catalogue(server=server)) == ""


def test_a_meta_or_a_run_name_too_large_to_journal_is_refused_before_anything_is_sent(recorder, conf):
    """Issue 43, finding 9: `_meta` and `runName` were journaled whatever their size; a 3 MB run name was
    read back on every page of the run list."""
    for meta, said in (({"vendor/blob": "x" * 70_000}, "over the 65536 the Recorder journals"),
                       ({"hatp/journal": {"runName": "n" * 201}}, "a text of at most 200 characters"),
                       ({"hatp/journal": {"runName": ["not", "a", "name"]}}, "a text of at most 200")):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "conf__test_simple_text", "arguments": {},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", **meta}}})
        result = post_stateless_call(recorder, conf, "conf__test_simple_text", body).json()["result"]
        assert result["isError"] and said in result["content"][0]["text"], result
    assert Step.objects.count() == 0
