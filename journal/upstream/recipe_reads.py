"""A recipe's read of a record, made again through the one client: by the Recorder just after a call (what
the agent left), by a plan's check, and by the worker just before and after an undo. The step keeps how the
record was read before the call (`recipes.earlier_state`: the tool, its arguments, where the version is, and
whether order counts), so each of them reads it exactly the same way."""

import asyncio
from typing import Any

from ..undo import recipes
from .client import Endpoint, Upstreams


async def read_state(upstreams: Upstreams, endpoint: Endpoint, earlier: dict[str, Any], *,
                     timeout: float | None = None, owner=None, limit: int = 0) -> tuple[str, Any]:
    """The record's version now, and what was read (its `structuredContent`, or its text), or None when it
    is over `limit` bytes. ToolServerError when it cannot be read, ValueError when the answer cannot be
    versioned."""
    answer = await upstreams.call_tool(endpoint, earlier["tool"], earlier.get("arguments") or {},
                                       timeout=timeout, owner=owner)
    return await asyncio.to_thread(_versioned, answer, earlier, limit)  # off the event loop: see patterns


def _versioned(answer: Any, earlier: dict[str, Any], limit: int) -> tuple[str, Any]:
    version = recipes.version(answer, earlier.get("versionAt") or "",
                              ignore_order=bool(earlier.get("ignoreOrder")),
                              pattern=earlier.get("versionPattern"))
    return version, recipes.kept_state(answer, limit)
