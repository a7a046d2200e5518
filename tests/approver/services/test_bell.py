"""The one doorbell: it rings after the commit, never before, and a broker that is down never turns a
committed change into an error (the periodic tasks ring again)."""

import logging
from datetime import timedelta

import pytest
from django.db import transaction
from kombu.exceptions import OperationalError

from approver import services, tasks
from approver.models import Plan
from approver.services import bell

pytestmark = pytest.mark.django_db(transaction=True)


def broker_down(*args, **kwargs):
    raise OperationalError("Error 111 connecting to localhost:6379. Connection refused.")


def test_the_bell_rings_only_once_the_transaction_commits(monkeypatch):
    rung = []
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: rung.append(args))
    with transaction.atomic():
        bell.ring(bell.EXECUTE_PLAN, 7)
        assert rung == []
    assert rung == [(7,)]


def test_a_bell_rolled_back_with_its_transaction_never_rings(monkeypatch):
    rung = []
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: rung.append(args))
    with pytest.raises(RuntimeError), transaction.atomic():
        bell.ring(bell.EXECUTE_PLAN, 7)
        raise RuntimeError("the change failed")
    assert rung == []


def test_a_later_bell_is_a_countdown(monkeypatch):
    rung = []
    monkeypatch.setattr(
        tasks.execute_plan, "apply_async", lambda args, countdown: rung.append((args, countdown))
    )
    bell.ring(bell.EXECUTE_PLAN, 7, countdown=12.5)
    bell.ring(bell.EXECUTE_PLAN, 8, countdown=-1)  # a moment already past rings at once
    assert rung == [((7,), 12.5), ((8,), 0.0)]


def test_a_plan_asked_for_while_the_broker_is_down_is_kept_and_its_checks_are_rung_again_later(
        globex, on_call, monkeypatch, caplog):
    monkeypatch.setattr(tasks.check_plan, "delay", broker_down)
    with caplog.at_level(logging.ERROR, logger="approver.services.bell"):
        plan = services.request_plan(run=globex, requested_by=on_call, reason="wrong customer", from_step=1)
    assert Plan.objects.get(pk=plan.pk).state == "checking"  # on record, though no worker was told
    assert "could not ring the worker for approver.check_plan" in caplog.text
    rung = []
    monkeypatch.setattr(tasks.check_plan, "delay", lambda *args: rung.append(args))
    Plan.objects.filter(pk=plan.pk).update(updated_at=tasks.stalled_before() - timedelta(seconds=1))
    tasks.requeue_stalled_checks()
    assert rung == [(plan.pk, plan.check_round)]
