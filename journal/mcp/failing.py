"""How the Recorder answers a failed call: the error result with MCP-Rescue's advice
(`journal.undo.recovery`), and,
under a policy that stops the run on failure (ChronoMCP's saga mode), the plan that undoes the run's task and
what was unwound (the approval side does both, behind `journal.ports`)."""

import logging
from typing import Any

import anyio
import mcp_types as types
from asgiref.sync import sync_to_async
from django.conf import settings

from .. import ports, services
from ..undo import declarations, recovery
from .journal_thread import Journaled

logger = logging.getLogger(__name__)


def tool_error(
    text: str, advice: recovery.Advice, saga: dict[str, Any] | None = None
) -> types.CallToolResult:
    """A failed call as the Recorder answers it: the words, what the agent should do about it, and (under a
    saga policy) the plan that undoes its task and what was unwound."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True,
                                _meta=advice_meta(advice, saga=saga))


def advice_meta(
    advice: recovery.Advice, meta: Any = None, saga: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`meta` with the advice in `hatp/journal.recovery`, and `undoPlan` / `unwound` after a saga policy
    stopped the run (keys the Recorder writes, never the server or the agent: a server's own are replaced,
    the rest of its `hatp/journal` is kept)."""
    meta = dict(meta) if isinstance(meta, dict) else {}
    journal = meta.get(declarations.HATP_KEY)
    meta[declarations.HATP_KEY] = {
        **(journal if isinstance(journal, dict) else {}),
        "recovery": advice.as_wire(),
        **(saga or {}),
    }
    return meta


ADVICE_PREFIX = "[Recorder advice] "


def with_advice_text(result: Any) -> Any:
    """A failed call's result with its advice (`hatp/journal.recovery`) repeated as one short text block
    at the end of its content, for a model whose framework drops `_meta`; any other result as it was."""
    if isinstance(result, types.CallToolResult):
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        added = with_advice_text(dumped)
        return result if added is dumped else types.CallToolResult.model_validate(added)
    if not isinstance(result, dict) or result.get("isError") is not True:
        return result
    meta = result.get("_meta") if isinstance(result.get("_meta"), dict) else {}
    journal = meta.get(declarations.HATP_KEY)
    advice = journal.get("recovery") if isinstance(journal, dict) else None
    if not isinstance(advice, dict) or not isinstance(advice.get("action"), str):
        return result
    words = recovery.ACTION_WORDS.get(advice["action"], advice["action"])
    text = f"{ADVICE_PREFIX}{words[0].upper()}{words[1:]}"
    if isinstance(advice.get("retryAfter"), int | float):
        text += f" after {advice['retryAfter']:g} s"
    text += f": {advice.get('why', '')}" if isinstance(advice.get("why"), str) else "."
    content = result.get("content") if isinstance(result.get("content"), list) else []
    return {**result, "content": [*content, {"type": "text", "text": text[:500]}]}


_ANY_TOOL = recovery.Tool()  # a failure before any known tool was reached


def failed(category: str, tool: recovery.Tool = _ANY_TOOL, **facts) -> recovery.Advice:
    """The advice for a failure of `category` (with `recovery.Failure`'s other facts) of this tool."""
    return recovery.advise(recovery.Failure(category=category, **facts), tool)


async def stop_the_run(opened: services.OpenedStep, journaled: "Journaled") -> dict[str, Any] | None:
    """A failed call under a policy that stops the run on failure (ChronoMCP's saga mode; see
    `approver.services.sagas`): once the failure is journaled, the plan that undoes the run's task is opened
    and the run halted; under "unwind" the plan is checked and run now, up to RECORDER_UNWIND_SECONDS, if no
    human is needed. Returns what the agent's error carries (`undoPlan`, `unwound`), or None. The agent
    hears of its failure only after this, so it never acts in a half-undone world."""
    mode = (opened.policy or {}).get("onFailure")
    if mode not in ("propose", "unwind"):
        return None
    await journaled
    gate = ports.gate()
    try:
        started = await sync_to_async(gate.failed, thread_sensitive=False)(
            run_id=opened.run_id, step_id=opened.step_id, mode=mode)
    except Exception:  # the failure is the agent's news; not being able to stop the run must not hide it
        logger.exception("could not open the undo plan for step %s of run %s", opened.number, opened.run_id)
        return {"undoPlan": None, "undoRefused": "The Recorder could not open a plan to undo the run."}
    if "plan" not in started:
        return {"undoPlan": None, "undoRefused": started.get("refused")}
    saga: dict[str, Any] = {"undoPlan": started["url"]}
    if mode == "unwind":
        saga["unwound"] = {"plan": started["url"], "state": "executing", "reversed": [], "notReversed": [],
                           "timedOut": f"Still unwinding after {settings.RECORDER_UNWIND_SECONDS} s; the "
                                       "worker finishes it, and the plan's page says how it ends."}
        with anyio.move_on_after(settings.RECORDER_UNWIND_SECONDS):
            try:
                saga["unwound"] = await sync_to_async(gate.unwind, thread_sensitive=False)(
                    plan=started["plan"]
                )
            except Exception:
                logger.exception("unwinding plan %s failed", started["plan"])
                saga["unwound"] = {
                    "plan": started["url"],
                    "error": "The Recorder could not unwind the run; the plan's page says where it stands.",
                }
    return saga
