"""Issue 43, agents as they really run: model APIs refuse a tool named over 64 characters, and frameworks then
fail on the whole tool list. A server whose `name__tool` names are too long is warned of at registration,
with a free alias that fits offered; with the alias, agents see (and call) `alias__tool`, while the record,
policies and plans keep the server's name, and calls by the old prefix still reach it."""

import io

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from journal import services
from journal.models import Step, ToolServer

from .helpers import run_agent

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "globex-customer-relationship-management-production-eu-west"  # 58 characters: crm's tools run over 64


def test_a_server_named_too_long_for_its_tools_gets_an_alias_agents_see_and_call(recorder, sample_servers,
                                                                                  dana):
    err, out = io.StringIO(), io.StringIO()
    call_command("add_tool_server", LONG, sample_servers.url("crm"), stdout=out, stderr=err)
    said = err.getvalue()
    assert f"of {LONG}'s tools are named longer than the 64 characters" in said, said
    room = 64 - 2 - max(len(tool) for tool in ToolServer.objects.get(name=LONG).tool_names)
    assert f"give it an alias of at most {room} characters" in said, said
    assert f"--alias {LONG[:room].strip('-')}" in said, said
    err = io.StringIO()
    call_command("add_tool_server", LONG, "--update", "--alias", "crm-eu", stdout=out, stderr=err)
    assert err.getvalue() == "" and "agents see them as crm-eu__tool" in out.getvalue()
    server = ToolServer.objects.get(name=LONG)
    assert services.names_too_long(server) == ""

    token = services.create_agent(name="desk-bot", on_behalf_of=dana)[1]

    async def script(client):
        names = [tool.name for tool in (await client.list_tools()).tools]
        by_alias = await client.call_tool("crm-eu__update_deal", {"deal_id": "D-881", "stage": "Won"})
        by_name = await client.call_tool(f"{LONG}__update_deal", {"deal_id": "D-881", "stage": "Lost"})
        return names, by_alias, by_name

    names, by_alias, by_name = run_agent(recorder, token, script)
    assert "crm-eu__update_deal" in names and all(len(name) <= 64 for name in names), names
    assert not by_alias.is_error and not by_name.is_error
    steps = list(Step.objects.order_by("number"))
    assert [(step.server_name, step.tool, step.status) for step in steps] == [
        (LONG, "update_deal", "ok"), (LONG, "update_deal", "ok")]
    assert [entry["op"] for entry in sample_servers.ledger("crm")].count("update_deal") == 2


def test_an_alias_cannot_take_another_servers_name_or_alias_nor_hold_the_separator(db, sample_servers):
    services.register_tool_server(name="crm", url=sample_servers.url("crm"))
    mail = services.register_tool_server(name="mail", url=sample_servers.url("mail"), alias="post")
    for alias, said in (("crm", "already another tool server's name or alias"),
                        ("post", "already another tool server's name or alias"),
                        ("c__rm", "cannot contain '__'")):
        with pytest.raises(ValidationError, match=said):
            services.register_tool_server(name="calendar", url=sample_servers.url("calendar"), alias=alias)
    with pytest.raises(ValidationError, match="already another tool server's alias"):
        services.register_tool_server(name="post", url=sample_servers.url("calendar"))
    assert services.save_tool_server(server=mail, alias="").prefix == "mail"
