"""The worker's reads around a recipe undo (`journal.recipes`): its server has no conditional write, so the
record is read just before the undo (nothing is sent when it changed since the check) and again after its
last call (it counts only once the record reads as it did before the agent's call). The judgments are
`execution.recipe_before_undo` and `execution.recipe_after_undo`."""

from typing import Any

from django.conf import settings

from journal.upstream.client import ToolServerError, Upstreams, endpoint_of
from journal.upstream.recipe_reads import read_version

from .. import execution, planning
from ..models import PlanItem


def earlier_read(item: PlanItem) -> dict[str, Any] | None:
    """How a recipe read the record before the agent's call, if this item is such an undo."""
    earlier = item.step.earlier_state or {}
    return earlier if item.dialect == planning.RECIPE and earlier.get("version") else None


async def before(item: PlanItem, earlier: dict[str, Any]) -> execution.Verdict | None:
    """A recipe undo's read just before it runs (see `execution.recipe_before_undo`)."""
    overwrite = ""
    if item.conflict_choice == PlanItem.Choice.OVERWRITE and item.check_status == PlanItem.Check.CONFLICT:
        overwrite = ((item.check_detail or {}).get("current") or {}).get("version") or ""
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        endpoint = endpoint_of(item.step.server)
        try:
            now = await read_version(upstreams, endpoint, earlier)
        except (ToolServerError, ValueError) as exc:
            return execution.Verdict(execution.COMPENSATION_FAILED, {"message": (
                f"{endpoint.name} could not be read before the undo, so nothing was sent: "
                f"{getattr(exc, 'message', exc)}")}, retry=bool(getattr(exc, "transient", False)))
    return execution.recipe_before_undo(now=now, agent_left=item.if_version, before=earlier["version"],
                                        overwrite=overwrite)


async def after(item: PlanItem, earlier: dict[str, Any], verdict: execution.Verdict) -> execution.Verdict:
    """A recipe undo's read after its last call (see `execution.recipe_after_undo`)."""
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        endpoint = endpoint_of(item.step.server)
        try:
            now = await read_version(upstreams, endpoint, earlier)
        except (ToolServerError, ValueError) as exc:
            return execution.Verdict(execution.OUTCOME_UNKNOWN, {**verdict.detail, "message": (
                f"The undo ran, but {endpoint.name} could not be read again to see whether it took: "
                f"{getattr(exc, 'message', exc)}")})
    return execution.recipe_after_undo(verdict, now=now, before=earlier["version"])
