"""Runs built through the real services, without a network: for tests of what happens after the call."""

from datetime import UTC, datetime, timedelta

from journal import services


def journal_call(agent, *, run_key="run:test", server=None, server_name="crm", tool="update_deal",
                 arguments=None, result=None, error=None, at=None, request_meta=None):
    at = at or datetime(2026, 11, 29, 10, tzinfo=UTC)
    opened = services.open_step(
        agent=agent,
        run_key=run_key,
        server=server,
        server_name=server_name,
        tool=tool,
        arguments=arguments or {"deal_id": "D-881"},
        request_meta=request_meta,
        now=at,
    )
    outcome = (
        services.Outcome(result=result or {"content": [{"type": "text", "text": "ok"}]})
        if error is None
        else error
    )
    return services.close_step(
        opened=opened, outcome=outcome, started=at, finished=at + timedelta(milliseconds=40)
    )


def make_run(agent, steps=5, **kwargs):
    for index in range(steps):
        journal_call(agent, arguments={"n": index}, **kwargs)
    return agent.runs.get(key=kwargs.get("run_key", "run:test"))


def crm_server(receipt_keys=None):
    """A registered CRM whose catalogue is saved without a network: update_deal, compensable through
    hatp_compensate, with the receipt keys given."""
    server = services.register_tool_server(name="crm", url="http://127.0.0.1:9/crm/mcp")
    journal = {"undo": {"kind": "compensate", "window": "P7D"}}
    if receipt_keys:
        journal["receiptKeys"] = receipt_keys
    tools = [{"name": "update_deal", "inputSchema": {"type": "object"}, "_meta": {"hatp/journal": journal}},
             {"name": "hatp_compensate", "inputSchema": {"type": "object"}}]
    return services.save_catalogue(server=server, tools=tools)
