"""The worker's reads around a recipe undo (`journal.undo.recipes`): its server has no conditional write, so
the record is read just before the undo (nothing is sent when it changed since the check) and again after its
last call (it counts only once the record reads as it did before the agent's call). The judgments are
`execution.recipe_before_undo` and `execution.recipe_after_undo`."""

from typing import Any

from django.conf import settings

from journal.upstream.client import ToolServerError, Upstreams, endpoint_of
from journal.upstream.recipe_reads import read_state

from .. import changes, execution, planning
from ..checks import STATE_SHOWN_BYTES
from ..models import PlanItem


def earlier_read(item: PlanItem) -> dict[str, Any] | None:
    """How a recipe read the record before the agent's call, if this item is such an undo."""
    earlier = item.step.earlier_state or {}
    return earlier if item.dialect == planning.RECIPE and earlier.get("version") else None


def overwrites(item: PlanItem) -> str:
    """The version the approvers chose to undo over (a newer change they saw), or ""."""
    if item.conflict_choice == PlanItem.Choice.OVERWRITE and item.check_status == PlanItem.Check.CONFLICT:
        return ((item.check_detail or {}).get("current") or {}).get("version") or ""
    return ""


async def before(item: PlanItem, earlier: dict[str, Any]) -> tuple[execution.Verdict | None, Any]:
    """A recipe undo's read just before it runs (see `execution.recipe_before_undo`), and, for an undo over
    a newer change, the record as read then: what the approvers chose to undo over."""
    overwrite = overwrites(item)
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        endpoint = endpoint_of(item.step.server)
        try:
            now, seen = await read_state(upstreams, endpoint, earlier, limit=STATE_SHOWN_BYTES)
        except (ToolServerError, ValueError) as exc:
            return execution.Verdict(execution.COMPENSATION_FAILED, {"message": (
                f"{endpoint.name} could not be read before the undo, so nothing was sent: "
                f"{getattr(exc, 'message', exc)}")}, retry=bool(getattr(exc, "transient", False))), None
    return execution.recipe_before_undo(now=now, agent_left=item.if_version, before=earlier["version"],
                                        overwrite=overwrite), seen if overwrite and now == overwrite else None


async def after(item: PlanItem, earlier: dict[str, Any], verdict: execution.Verdict, seen: Any = None
                ) -> execution.Verdict:
    """A recipe undo's read after its last call (see `execution.recipe_after_undo`); an undo over a newer
    change (`seen`: the record as the approvers chose to undo over it) counts by what they signed
    (`execution.recipe_after_override`)."""
    async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
        endpoint = endpoint_of(item.step.server)
        try:
            now, state = await read_state(upstreams, endpoint, earlier, limit=STATE_SHOWN_BYTES)
        except (ToolServerError, ValueError) as exc:
            return execution.Verdict(execution.OUTCOME_UNKNOWN, {**verdict.detail, "message": (
                f"The undo ran, but {endpoint.name} could not be read again to see whether it took: "
                f"{getattr(exc, 'message', exc)}")})
    if seen is None or state is None or earlier.get("structured") is None or earlier.get("left") is None:
        return execution.recipe_after_undo(verdict, now=now, before=earlier["version"])
    taken_back, kept = changes.taken_back_and_kept(before=earlier["structured"], left=earlier["left"],
                                                   seen=seen, after=state)
    return execution.recipe_after_override(verdict, now=now, before=earlier["version"], taken_back=taken_back,
                                           kept=kept)
