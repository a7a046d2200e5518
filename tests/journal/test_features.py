"""The rest of MCP through the Recorder, against the npm reference server-everything (stdio, 2025-11-25):
resources, templates and reads, prompts, completion, logging, and the server's own requests to the agent
(elicitation, sampling, roots), each compared with what the same client gets directly."""

import time
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from pydantic import AnyUrl, TypeAdapter

from journal import services
from journal.mcp import bridge
from journal.models import Step
from tests.conftest import ServerThread, free_port
from tests.fixtures import handshake_server
from tests.fixtures import modern_server as modern_server_app
from tests.services import needs_node

from .helpers import run_agent
from .test_conformance import normalised
from .test_pairings import EVERYTHING, same, stdio

pytestmark = [pytest.mark.django_db(transaction=True), needs_node]
MODES = ["auto", "legacy"]


@pytest.fixture
def token(dana):
    services.refresh_catalogue(
        server=services.register_tool_server(name="everything", command=" ".join(EVERYTHING))
    )
    return services.create_agent(name="bot", on_behalf_of=dana)[1]


def dumped(model) -> dict:
    """A result as compared: its own fields, without the envelope each hop stamps for itself."""
    return same(model)


def directly(script, **options):
    async def main():
        async with Client(stdio(EVERYTHING), cache=None, **options) as client:
            return await script(client)

    return anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_resources_and_templates_are_listed_namespaced_and_read_as_the_server_sent_them(
    recorder, token, mode
):
    async def lists(client):
        return dumped(await client.list_resources()), dumped(await client.list_resource_templates())

    direct_resources, direct_templates = directly(lists)
    resources, templates = run_agent(recorder, token, lists, mode=mode)
    prefix = "recorder://everything/"
    assert [r["uri"] for r in resources["resources"]] == [
        f"{prefix}{r['uri']}" for r in direct_resources["resources"]]
    assert [{**r, "uri": r["uri"].removeprefix(prefix)} for r in resources["resources"]] == \
        direct_resources["resources"]
    assert [
        {**t, "uriTemplate": t["uriTemplate"].removeprefix(prefix)}
        for t in templates["resourceTemplates"]
    ] == direct_templates["resourceTemplates"]
    # Issue 24, 2: each is a URI (RFC 3986: `everything__demo://…` had `_` in its scheme), as clients built
    # on pydantic's URL type (the mcp SDK 1.x, langchain-mcp-adapters) or on `new URL` require.
    for item in [*resources["resources"], *templates["resourceTemplates"]]:
        TypeAdapter(AnyUrl).validate_python(item.get("uri") or item["uriTemplate"].replace("{", "").replace(
            "}", ""))

    first = direct_resources["resources"][0]["uri"]

    async def read(client, uri):
        return dumped(await client.read_resource(uri))

    direct = directly(lambda client: read(client, first))
    assert run_agent(recorder, token, lambda client: read(client, f"{prefix}{first}"), mode=mode) == direct
    # The older form, which an agent may have kept, still routes.
    older = f"everything__{first}"
    assert run_agent(recorder, token, lambda client: read(client, older), mode=mode) == direct
    step = Step.objects.filter(tool="resources/read").first()
    assert (step.status, step.reversibility, step.arguments) == ("ok", "read_only", {"uri": first})


@pytest.mark.parametrize("mode", MODES)
def test_a_resource_link_a_tool_returns_is_read_through_the_recorder(recorder, token, mode):
    async def script(client):
        links = await client.call_tool("everything__get-resource-links", {"count": 1})
        link = next(block for block in links.content if block.type == "resource_link")
        return link.uri, dumped(await client.read_resource(link.uri))

    uri, through = run_agent(recorder, token, script, mode=mode)
    # A dynamic resource says when it was made: compared without that reading of the clock.
    assert normalised(through, Path("/nowhere")) == normalised(directly(lambda client: _read(client, uri)),
                                                                Path("/nowhere"))
    assert [s.tool for s in Step.objects.order_by("number")] == ["get-resource-links", "resources/read"]


async def _read(client, uri):
    return dumped(await client.read_resource(uri))


@pytest.mark.parametrize("mode", MODES)
def test_a_uri_no_server_gave_the_session_is_not_found(recorder, token, mode):
    async def script(client):
        with pytest.raises(MCPError) as failure:
            await client.read_resource("file:///etc/passwd")
        return failure.value.error

    error = run_agent(recorder, token, script, mode=mode)
    advice = error.data.pop("_meta")["hatp/journal"]["recovery"]
    assert error.code == -32002 and error.data == {"source": "recorder", "reason": "unknown_resource",
                                                    "uri": "file:///etc/passwd"}
    assert advice["action"] == "repair_arguments"
    assert not Step.objects.exists()  # nothing was sent anywhere


@pytest.mark.parametrize("mode", MODES)
def test_prompts_and_completion_pass_through_namespaced(recorder, token, mode):
    async def direct_script(client):
        return (
            dumped(await client.list_prompts()),
            dumped(await client.get_prompt("simple-prompt")),
            dumped(await client.get_prompt("args-prompt", {"city": "Lisbon", "state": "PT"})),
            dumped(
                await client.complete(
                    types.PromptReference(type="ref/prompt", name="completable-prompt"),
                    {"name": "department", "value": "E"},
                )
            ),
        )

    async def through_script(client):
        return (
            dumped(await client.list_prompts()),
            dumped(await client.get_prompt("everything__simple-prompt")),
            dumped(await client.get_prompt("everything__args-prompt", {"city": "Lisbon", "state": "PT"})),
            dumped(
                await client.complete(
                    types.PromptReference(type="ref/prompt", name="everything__completable-prompt"),
                    {"name": "department", "value": "E"},
                )
            ),
        )

    direct = directly(direct_script)
    listed, *rest = run_agent(recorder, token, through_script, mode=mode)
    assert [{**p, "name": p["name"].removeprefix("everything__")} for p in listed["prompts"]] == direct[0][
        "prompts"
    ]
    assert all(p["name"].startswith("everything__") for p in listed["prompts"])
    assert rest == list(direct[1:])
    assert direct[3]["completion"]["values"] == ["Engineering"]


def test_an_agent_that_can_answer_the_servers_requests_gets_its_tools_and_answers_them(recorder, token):
    """server-everything offers its elicitation, sampling and roots tools only to a client that declares it
    can answer them: through the Recorder the agent sees them, and answers the server's requests itself."""
    asked = []

    async def elicit(context, params):
        asked.append("elicitation/create")
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "integer": 3})

    async def sample(context, params):
        asked.append("sampling/createMessage")
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="four"),
            model="test-model",
            stop_reason="endTurn",
        )

    async def roots(context):
        asked.append("roots/list")
        return types.ListRootsResult(roots=[types.Root(uri="file:///work", name="work")])

    callbacks = {"elicitation_callback": elicit, "sampling_callback": sample, "list_roots_callback": roots}
    calls = [("trigger-elicitation-request", {}), ("trigger-sampling-request", {"prompt": "2+2?"}),
             ("get-roots-list", {})]

    async def direct_script(client):
        names = {tool.name for tool in (await client.list_tools()).tools}
        return names, [dumped(await client.call_tool(tool, arguments)) for tool, arguments in calls]

    async def through_script(client):
        names = {tool.name.removeprefix("everything__") for tool in (await client.list_tools()).tools}
        return names, [
            dumped(await client.call_tool(f"everything__{tool}", arguments)) for tool, arguments in calls
        ]

    direct_names, direct = directly(direct_script, **callbacks)
    asked.clear()
    names, through = run_agent(recorder, token, through_script, mode="legacy", **callbacks)
    assert (
        {"trigger-elicitation-request", "trigger-sampling-request", "get-roots-list"} <= names == direct_names
    )
    assert through == direct
    assert asked == ["elicitation/create", "sampling/createMessage", "roots/list"]
    relayed = [
        entry.data for entry in Step.objects.first().run.entries.filter(event="relayed").order_by("seq")
    ]
    assert [(r["step"], r["method"]) for r in relayed] == [
        (1, "elicitation/create"), (2, "sampling/createMessage"), (3, "roots/list")]
    assert relayed[0]["answer"]["content"]["name"] == "Ada"


def test_an_agent_that_cannot_answer_them_is_never_offered_those_tools(recorder, token):
    async def names(client):
        return {tool.name.removeprefix("everything__") for tool in (await client.list_tools()).tools}

    through = run_agent(recorder, token, names, mode="legacy")
    assert "trigger-elicitation-request" not in through and through == directly(names)


def test_the_servers_log_messages_reach_an_agent_that_set_a_level(recorder, token):
    heard = []

    async def logged(params):
        heard.append(params.level)

    async def script(client):
        await client.set_logging_level("debug")
        await client.call_tool("everything__toggle-simulated-logging", {})
        for _ in range(100):
            if heard:
                break
            await anyio.sleep(0.1)
        await client.call_tool("everything__toggle-simulated-logging", {})
        return heard

    assert run_agent(recorder, token, script, mode="legacy", logging_callback=logged)


def test_updates_of_a_subscribed_resource_reach_the_agent_under_the_uri_it_subscribed_to(recorder, token):
    updated = []

    async def handler(message):
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(message.params.uri)

    async def script(client):
        first = (await client.list_resources()).resources[0].uri
        await client.subscribe_resource(first)
        await client.call_tool("everything__toggle-subscriber-updates", {})
        for _ in range(100):
            if updated:
                break
            await anyio.sleep(0.1)
        await client.call_tool("everything__toggle-subscriber-updates", {})
        await client.unsubscribe_resource(first)
        return first

    first = run_agent(recorder, token, script, mode="legacy", message_handler=handler)
    assert first.startswith("recorder://everything/") and updated and set(updated) == {first}


def test_an_agent_on_the_stateless_protocol_answers_an_older_servers_questions_by_its_retry(recorder, token):
    """server-everything speaks only the handshake and asks in the middle of its call; a 2026 agent can be
    asked only by its call's answer (`input_required`), and answers by calling again. Through the Recorder
    it gets what a handshake client gets directly, and the call is one step, with the question in it."""
    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "integer": 3})

    async def direct_script(client):
        return dumped(await client.call_tool("trigger-elicitation-request", {}))

    async def through_script(client):
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "everything__trigger-elicitation-request" in names
        return dumped(await client.call_tool("everything__trigger-elicitation-request", {}))

    direct = directly(direct_script, elicitation_callback=elicit)
    assert run_agent(recorder, token, through_script, mode="auto", elicitation_callback=elicit) == direct
    step = Step.objects.get()
    assert step.status == "ok"
    assert step.run.entries.get(event="relayed").data["answer"]["content"]["name"] == "Ada"


@pytest.fixture
def sdk_only_recorder(settings, transactional_db):
    """A Recorder that takes every 2026-07-28 call through the SDK's app (RECORDER_FAST_CALLS=0)."""
    from approver.asgi import build_application

    settings.RECORDER_FAST_CALLS = False
    with ServerThread(build_application(), free_port()) as thread:
        yield thread


@pytest.mark.parametrize("path", ["progress", "sdk only"])
def test_a_stateless_agent_is_asked_on_every_path_with_progress_or_through_the_sdk(
        request, token, path):
    """Issue 24, 1: a call carrying a progress token (the fastmcp client puts one on every call) or a
    Recorder with its fast path off took the call through the SDK's app, whose 2026-07-28 request has no
    channel back: the server's question failed with "no back-channel". It is asked by the call's answer."""
    recorder = request.getfixturevalue("sdk_only_recorder" if path == "sdk only" else "recorder")
    progressed = []

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "integer": 3})

    async def noted(done, total, message):
        progressed.append(done)

    async def script(client):
        return dumped(await client.call_tool("everything__trigger-elicitation-request", {},
                                             progress_callback=noted if path == "progress" else None))

    async def direct_script(client):
        return dumped(await client.call_tool("trigger-elicitation-request", {}))

    direct = directly(direct_script, elicitation_callback=elicit)
    assert run_agent(recorder, token, script, mode="auto", elicitation_callback=elicit) == direct
    step = Step.objects.get()
    assert step.status == "ok"
    assert step.run.entries.get(event="relayed").data["answer"]["content"]["name"] == "Ada"


def test_a_stateless_agent_that_never_answers_leaves_the_step_undelivered(recorder, token, monkeypatch):
    monkeypatch.setattr(bridge, "ANSWER_SECONDS", 0.5)

    async def script(client):
        result = await client.session.call_tool("everything__trigger-elicitation-request", {},
                                                allow_input_required=True)
        return result  # the agent is asked, and walks away

    async def never(context, params):
        raise AssertionError("the client is not driving the retry here")

    asked = run_agent(recorder, token, script, mode="auto", elicitation_callback=never)
    assert asked.result_type == "input_required" and asked.request_state.startswith("recorder:")
    for _ in range(100):
        step = Step.objects.get()
        if step.status == "undelivered":
            break
        time.sleep(0.1)
    assert step.status == "undelivered" and "never came back" in step.error_message


def test_a_question_the_agent_walked_away_from_does_not_hold_up_its_next_call(recorder, token):
    """Issue 24, 4: the next call's question went to the abandoned call's answer, and waited ANSWER_SECONDS
    (300 s). Now the abandoned question is expired (the server hears the agent did not answer) and the next
    call is asked by its own answer."""
    async def walk_away(client):
        return await client.session.call_tool("everything__trigger-elicitation-request", {},
                                              allow_input_required=True)

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"name": "Bo", "check": True, "integer": 1})

    async def answer(client):
        return await client.call_tool("everything__trigger-elicitation-request", {})

    asked = run_agent(recorder, token, walk_away, mode="auto", elicitation_callback=elicit)
    assert asked.result_type == "input_required"
    started = time.monotonic()
    answered = run_agent(recorder, token, answer, mode="auto", elicitation_callback=elicit)
    assert time.monotonic() - started < 30 and not answered.is_error
    assert "Name: Bo" in answered.content[1].text
    first, second = Step.objects.order_by("number")
    for _ in range(100):
        first.refresh_from_db()
        if first.status != "pending":
            break
        time.sleep(0.1)
    assert second.status == "ok" and first.status == "undelivered"
    assert "did not answer: it made another call instead" in str(
        first.run.entries.filter(event="relayed").first().data)


def test_an_agent_on_the_stateless_protocol_hears_updates_of_resources_it_listens_for(recorder, token):
    """A 2026 agent has no channel back but the `subscriptions/listen` stream it opens: the Recorder
    subscribes at the server for the resources it names, and the server's updates arrive on that stream."""
    async def script(client):
        first = (await client.list_resources()).resources[0].uri
        heard = []
        async with client.listen(resource_subscriptions=[first]) as subscription:
            await client.call_tool("everything__toggle-subscriber-updates", {})
            with anyio.move_on_after(10):
                async for event in subscription:
                    heard.append(event.uri)
                    break
            await client.call_tool("everything__toggle-subscriber-updates", {})
        return first, heard

    first, heard = run_agent(recorder, token, script, mode="auto")
    assert first.startswith("recorder://everything/") and heard == [first]


@pytest.mark.parametrize("mode", MODES)
def test_a_servers_tool_list_change_reaches_the_agent_on_either_protocol(recorder, dana, mode):
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    heard = []

    async def handler(message):
        if isinstance(message, types.ToolListChangedNotification):
            heard.append("tools")

    async def script(client):
        if mode == "legacy":  # the handshake: on the session's own stream
            await client.call_tool("memo__announce", {})
            for _ in range(100):
                if heard:
                    break
                await anyio.sleep(0.05)
            return heard
        async with client.listen(tools_list_changed=True) as subscription:  # 2026: on its listen stream
            await client.call_tool("memo__announce", {})
            with anyio.move_on_after(10):
                async for event in subscription:
                    return [type(event).__name__]
        return []

    with ServerThread(handshake_server.build_app(), free_port()) as upstream:
        services.refresh_catalogue(
            server=services.register_tool_server(name="memo", url=f"{upstream.base}/mcp")
        )
        assert run_agent(recorder, token, script, mode=mode, message_handler=handler) == (
            ["tools"] if mode == "legacy" else ["ToolsListChanged"])


@pytest.fixture
def modern_server():
    with ServerThread(modern_server_app.build_app(), free_port()) as upstream:
        server = services.register_tool_server(name="modern", url=f"{upstream.base}/mcp")
        services.refresh_catalogue(server=server)
        yield server


@pytest.mark.parametrize("mode", MODES)
def test_a_stateless_servers_progress_reaches_the_agent(recorder, dana, modern_server, mode):
    """A server on the stateless protocol streams progress before its answer, on the one shared connection."""
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    async def script(client):
        seen = []

        async def progress(done, total, message):
            seen.append((done, total, message))

        result = await client.call_tool("modern__count", {"n": 3}, progress_callback=progress)
        return seen, result.content[0].text

    seen, text = run_agent(recorder, token, script, mode=mode)
    assert text == "counted to 3"
    assert seen == [(1, 3, "counted 1"), (2, 3, "counted 2"), (3, 3, "counted 3")]
    assert list(Step.objects.values_list("tool", "status")) == [("count", "ok")]


def test_a_handshake_agent_keeps_what_a_2026_capable_server_does_on_the_handshake(recorder, dana,
                                                                                   modern_server):
    """Issue 24, 6: the Recorder talked 2026 upstream even for a handshake agent, so the server's question in
    the middle of a call failed ("no back-channel") and its log messages in the call were dropped (3
    directly, 0 through). A handshake agent's upstream session is on the handshake too."""
    _, token = services.create_agent(name="bot", on_behalf_of=dana)

    def calls(prefix):
        async def script(client):
            return ((await client.call_tool(f"{prefix}chatty", {})).content[0].text,
                    (await client.call_tool(f"{prefix}ask", {})).content[0].text)
        return script

    def run(where, script):
        logs = []

        async def logged(params):
            logs.append(params.data)

        async def elicit(context, params):
            return types.ElicitResult(action="accept", content={"name": "Ada"})

        return where(script, logging_callback=logged, elicitation_callback=elicit), logs

    async def direct(script, **options):
        async with Client(streamable_http_client(modern_server.url), mode="legacy", cache=None,
                          **options) as client:
            return await script(client)

    def directly_on_the_handshake(script, **options):
        return anyio.run(lambda: direct(script, **options))

    expected = (("chatted", "accept: Ada"), ["step 1 of 3", "step 2 of 3", "step 3 of 3"])
    assert run(directly_on_the_handshake, calls("")) == expected
    through = run(lambda script, **options: run_agent(recorder, token, script, mode="legacy", **options),
                  calls("modern__"))
    assert through == expected
    assert list(Step.objects.values_list("tool", "status")) == [("chatty", "ok"), ("ask", "ok")]


def test_a_2026_agent_that_asked_for_a_calls_log_messages_gets_them(recorder, dana, modern_server):
    """Issue 24, 6: in-call log messages reached a 2026-07-28 agent that opted into them (its requests'
    `_meta` log level) directly, but not through the Recorder (3 directly, 0 through)."""
    _, token = services.create_agent(name="bot", on_behalf_of=dana)

    def run(where, name, **level):
        logs = []

        async def logged(params):
            logs.append((params.level, params.data))

        async def script(client):
            return (await client.call_tool(name, {})).content[0].text

        return where(script, logging_callback=logged, **level), logs

    async def direct(script, **options):
        async with Client(streamable_http_client(modern_server.url), mode="auto", cache=None,
                          **options) as client:
            return await script(client)

    expected = ("chatted", [("info", f"step {n} of 3") for n in (1, 2, 3)])
    directly_ = lambda script, **options: anyio.run(lambda: direct(script, **options))  # noqa: E731
    through = lambda script, **options: run_agent(recorder, token, script, mode="auto", **options)  # noqa: E731
    assert run(directly_, "chatty", log_level="info") == expected
    assert run(through, "modern__chatty", log_level="info") == expected
    # One that did not ask gets none, through the Recorder as directly.
    assert run(directly_, "chatty") == run(through, "modern__chatty") == ("chatted", [])


@pytest.mark.parametrize("mode", MODES)
def test_a_stateless_servers_changes_reach_the_agent_on_either_protocol(recorder, dana, modern_server, mode):
    """Such a server says what changed only on listen streams: the Recorder opens its own for the agent
    session, a 2026 agent's for as long as its own stream lasts, a handshake session's once it lists or
    subscribes, and the agent hears the change under the URI it knows."""
    _, token = services.create_agent(name="bot", on_behalf_of=dana)
    note = f"recorder://modern/{modern_server_app.NOTE}"
    heard = []

    async def handler(message):
        if isinstance(message, types.ToolListChangedNotification):
            heard.append("tools")
        elif isinstance(message, types.ResourceUpdatedNotification):
            heard.append(message.params.uri)

    async def until_heard(wanted: str, call, arguments: dict):
        # The agent's client opens its stream for what the server says on its own a moment after the
        # handshake; a notification sent before it is open is lost on the way to it, so ask again.
        with anyio.move_on_after(15):
            while wanted not in heard:
                await client_of[0].call_tool(call, arguments)
                await client_of[0].call_tool("modern__touch", {"uri": "note://unsubscribed"})
                await anyio.sleep(0.3)

    client_of = []

    async def script(client):
        assert [r.uri for r in (await client.list_resources()).resources] == [note]
        if mode == "legacy":  # the handshake: on the session's own stream
            client_of.append(client)
            await client.subscribe_resource(note)
            await until_heard("tools", "modern__announce", {})
            await until_heard(note, "modern__touch", {"uri": modern_server_app.NOTE})
            return sorted(set(heard), key=heard.index)
        events = []
        async with client.listen(tools_list_changed=True, resource_subscriptions=[note]) as subscription:
            await client.call_tool("modern__announce", {})
            await client.call_tool("modern__touch", {"uri": "note://unsubscribed"})
            await client.call_tool("modern__touch", {"uri": modern_server_app.NOTE})
            with anyio.move_on_after(10):
                async for event in subscription:
                    events.append(getattr(event, "uri", type(event).__name__))
                    if len(events) == 2:
                        break
        return events

    assert run_agent(recorder, token, script, mode=mode, message_handler=handler) == (
        ["tools", note] if mode == "legacy" else ["ToolsListChanged", note])
