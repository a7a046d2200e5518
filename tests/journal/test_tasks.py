from datetime import timedelta

from django.utils import timezone

from journal import services
from journal.models import Run
from journal.tasks import checkpoint_quiet_runs

from .factories import make_run


def test_quiet_runs_get_their_head_signed_once(dana):
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    quiet = make_run(agent, steps=2, run_key="run:quiet")
    busy = make_run(agent, steps=2, run_key="run:busy")
    Run.objects.filter(pk=quiet.pk).update(last_activity_at=timezone.now() - timedelta(minutes=5))
    Run.objects.filter(pk=busy.pk).update(last_activity_at=timezone.now())
    assert checkpoint_quiet_runs() == 1
    assert checkpoint_quiet_runs() == 0
    quiet.refresh_from_db()
    busy.refresh_from_db()
    assert quiet.checkpointed_seq == quiet.head_seq == 5  # the header and two calls
    assert busy.checkpointed_seq == 0
    assert services.verify_run(run=quiet).ok


def test_a_call_whose_answer_was_never_recorded_is_closed_as_unknown_once(dana):
    from datetime import UTC, datetime

    from journal.models import Step
    from journal.tasks import reconcile_stale_steps

    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    long_ago = datetime(2026, 11, 1, tzinfo=UTC)
    opened = services.open_step(
        agent=agent,
        run_key="run:crashed",
        server=None,
        server_name="crm",
        tool="update_deal",
        arguments={"deal_id": "D-881"},
        request_meta=None,
        now=long_ago,
    )
    fresh = services.open_step(agent=agent, run_key="run:crashed", server=None, server_name="crm",
                               tool="get_deal", arguments={}, request_meta=None, now=timezone.now())
    assert reconcile_stale_steps() == 1
    assert reconcile_stale_steps() == 0
    step = Step.objects.get(pk=opened.step_id)
    assert (step.status, step.failure_class, step.reversibility) == ("error", "unknown", "unknown")
    assert "may or may not have acted" in step.undo_problems[0]
    run = Run.objects.get(key="run:crashed")
    assert run.unknown_count == 1 and run.failed_count == 1
    # The answer arrives after all: it is not recorded twice.
    assert services.close_step(opened=opened, outcome=services.Outcome(result={"content": []}),
                               started=long_ago, finished=timezone.now()) is None
    assert Step.objects.get(pk=fresh.step_id).status == "pending"
    services.checkpoint_run(run=run)
    assert services.verify_run(run=run).ok


def test_the_agent_gets_the_answer_even_when_the_outcome_cannot_be_journaled(
    recorder, sample_servers, dana, monkeypatch
):
    from journal.models import Step
    from tests.journal.helpers import register_samples, run_agent

    register_samples(sample_servers, names=("crm",))
    _, token = services.create_agent(name="sales-bot", on_behalf_of=dana)

    def broken(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(services, "close_step", broken)

    async def script(client):
        return await client.call_tool("crm__update_deal", {"deal_id": "D-881", "stage": "Won"})

    result = run_agent(recorder, token, script)
    # The deal really changed, so the agent must hear so (an error would invite a second, duplicate call).
    assert not result.is_error and "Proposal → Won" in result.content[0].text
    assert Step.objects.get().status == "pending"  # the reconciler will mark it
