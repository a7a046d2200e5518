"""The version an undo is sent conditional on (`ifVersion`): what its approvers signed for, moved on by the
plan's own earlier undos of the same record."""

from .. import execution
from ..models import PlanItem


def if_version(item: PlanItem) -> str:
    """The version an item's compensation is conditional on: the one its approvers signed for
    (`signed_version`), moved on by this plan's own undos of the same record that ran before it, each from
    the version it started at to the one it left: the plan's own undo is not someone else's change, and
    anyone else's change meanwhile still stops it."""
    moves: list[tuple[str, str]] = []
    if item.record:
        for prior in PlanItem.objects.filter(
                plan_id=item.plan_id, step__server_id=item.step.server_id, record=item.record,
                position__lt=item.position, outcome=execution.COMPENSATED).order_by("position"):
            if left := (prior.outcome_detail or {}).get("version"):
                moves.append((_moved(signed_version(prior), moves), str(left)))
    return _moved(signed_version(item), moves)


def signed_version(item: PlanItem) -> str:
    """The newer version the approvers chose to overwrite, when they did; where only the run's own later
    change moved the record on, the version it left (`checks.chained`); else the one the agent left."""
    detail = item.check_detail or {}
    if item.conflict_choice == PlanItem.Choice.OVERWRITE and item.check_status == PlanItem.Check.CONFLICT:
        return (detail.get("current") or {}).get("version") or item.if_version
    if item.check_status == PlanItem.Check.OK and detail.get("after"):
        return str(detail["after"])
    return item.if_version


def _moved(version: str, moves: list[tuple[str, str]]) -> str:
    for started, left in moves:
        if version == started:
            version = left
    return version
