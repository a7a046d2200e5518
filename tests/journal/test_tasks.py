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
    assert quiet.checkpointed_seq == quiet.head_seq == 4
    assert busy.checkpointed_seq == 0
    assert services.verify_run(run=quiet).ok
