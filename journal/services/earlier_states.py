"""A held call's earlier state, read again once a person approved it: the record may have changed while the
call waited, and the undo must put back what was there just before the call was sent, not before it was
held. The step keeps the new read, and the run's record says it was read again."""

from datetime import datetime
from typing import Any

from django.db import transaction

from ..models import Step
from ..record.canonical import to_ijson
from .record import append_entry, locked_run_by_id, save_moving


def read_again(*, run_id: int, step_id: int, number: int, earlier: dict[str, Any], now: datetime) -> None:
    """Keep what a recipe read again just before a held call was forwarded."""
    earlier = to_ijson(earlier)
    with transaction.atomic():
        run = locked_run_by_id(run_id)
        Step.objects.filter(pk=step_id).update(earlier_state=earlier)
        append_entry(run=run, event="earlier_state", now=now, data={"step": number, "again": True, **earlier})
        save_moving(run, now=now)
