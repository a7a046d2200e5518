"""Several on-call engineers ask to undo the same run at the same moment: exactly one plan, clear refusals.

Marked `postgres`: `make test` runs it again on PostgreSQL, where the partial unique index on open plan
items is what settles the race; on SQLite the IMMEDIATE transactions serialise the requests.
"""

import threading

import pytest
from django.db import connection

from approver import services
from approver.models import Plan, PlanItem
from journal import services as journal_services
from tests.journal.factories import make_run

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 6


def test_racing_requests_for_the_same_steps_make_one_plan(dana, on_call):
    agent, _ = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    run = make_run(agent, steps=5)
    barrier = threading.Barrier(THREADS)
    made, refused, crashed = [], [], []

    def ask(from_step: int) -> None:
        try:
            barrier.wait(timeout=30)
            made.append(
                services.request_plan(run=run, requested_by=on_call, reason="race", from_step=from_step)
            )
        except services.PlanRefused as refusal:
            refused.append(refusal)
        except Exception as exc:  # collected and asserted on in the main thread
            crashed.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(1 + n % 3,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert crashed == []
    assert len(made) == 1 and len(refused) == THREADS - 1
    plan = Plan.objects.get()
    assert all(r.open_plan == plan and "already in an open plan" in r.message for r in refused)
    # Nothing half-made: the winner's items only, each step held once.
    held = list(PlanItem.objects.filter(holds_step=True).values_list("step_id", flat=True))
    assert len(held) == len(set(held)) == plan.items.count()
