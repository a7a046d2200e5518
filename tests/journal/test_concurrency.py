"""Many Recorder workers appending to one run at once: one chain, no gaps, no duplicates.

Marked `postgres`: `make test` runs these again on PostgreSQL, where the run row lock
(`select_for_update`) is what serialises the writers; on SQLite the IMMEDIATE transactions do.
"""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from journal import services
from journal.models import ChainEntry, Run, Step

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 8
CALLS_EACH = 6


def hammer(agent, run_key: str, errors: list) -> None:
    try:
        for index in range(CALLS_EACH):
            at = datetime(2026, 11, 29, 10, tzinfo=UTC)
            opened = services.open_step(agent=agent, run_key=run_key, server=None, server_name="legacy",
                                        tool="echo", arguments={"i": index}, request_meta=None, now=at)
            services.close_step(opened=opened, outcome=services.Outcome(result={"content": []}), started=at,
                                finished=at + timedelta(milliseconds=5))
    except Exception as exc:  # collected and asserted on in the main thread
        errors.append(exc)
    finally:
        connection.close()


def test_concurrent_calls_into_one_new_run_make_one_gapless_chain(dana, settings):
    settings.RECORDER_CHECKPOINT_EVERY = 7
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    errors: list = []
    threads = [threading.Thread(target=hammer, args=(agent, "run:race", errors)) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []

    run = Run.objects.get()  # one run, though every thread raced to create it
    total = THREADS * CALLS_EACH
    assert run.step_count == total
    assert sorted(Step.objects.values_list("number", flat=True)) == list(range(1, total + 1))
    assert sorted(ChainEntry.objects.values_list("seq", flat=True)) == list(
        range(1, 2 * total + 2)
    )  # and the header
    services.checkpoint_run(run=run)
    verdict = services.verify_run(run=run)
    assert verdict.ok, str(verdict)
    assert verdict.checkpoints >= (2 * total) // 7
