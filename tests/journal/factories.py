"""Runs built through the real services, without a network: for tests of what happens after the call."""

from datetime import UTC, datetime, timedelta

from journal import services


def journal_call(agent, *, run_key="run:test", server=None, server_name="crm", tool="update_deal",
                 arguments=None, result=None, error=None, at=None):
    at = at or datetime(2026, 11, 29, 10, tzinfo=UTC)
    opened = services.open_step(agent=agent, run_key=run_key, server=server, server_name=server_name, tool=tool,
                                arguments=arguments or {"deal_id": "D-881"}, request_meta=None, now=at)
    outcome = services.Outcome(result=result or {"content": [{"type": "text", "text": "ok"}]}) if error is None else error
    return services.close_step(opened=opened, outcome=outcome, started=at, finished=at + timedelta(milliseconds=40))


def make_run(agent, steps=5, **kwargs):
    for index in range(steps):
        journal_call(agent, arguments={"n": index}, **kwargs)
    return agent.runs.get(key=kwargs.get("run_key", "run:test"))
