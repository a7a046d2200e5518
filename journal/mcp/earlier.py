"""The Recorder's own reads for an admin's undo recipe (`journal.undo.recipes`): the record as it was just
before an agent's call (its earlier state, which the undo puts back, and that state's version), and its
version just after (what the agent left). Each read goes to the same server on the agent's own upstream
session, like the call itself, through the one client; a failure is an answer here, never an error, since
the recipe says what a failed read means (else the call's undo is unknown). A database server's SQL tool
reads its database instead, through the Recorder's own connection (`journal.upstream.database`): what the
statements would do, and where the capture stands."""

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from .. import services
from ..models import ToolServer
from ..record.canonical import sha256_hex
from ..telemetry import metrics
from ..undo import recipe_chains, recipes
from ..undo.bindings import BindingError
from ..undo.database import rows
from ..upstream import database, snapshots, windows
from ..upstream.client import ToolServerError, Upstreams, endpoint_of
from ..upstream.recipe_reads import read_state
from .failing import failed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NeedsRead:
    """`_begin`'s answer for a call whose recipe reads the record first: the server and the recipe."""

    server: ToolServer
    recipe: recipes.Recipe


def needs_read(server: ToolServer, tool: str) -> recipes.Recipe | None:
    """The recipe in force for a call of `tool`, when it reads the record (or its database) before the
    call."""
    if not server.recipes:
        return None
    recipe = recipes.applying(server.recipe(tool), server.tool(tool), server.catalogue)
    return recipe if recipe is not None and (recipe.read is not None or recipe.sql is not None) else None


def statements_digest(recipe: recipes.Recipe, arguments: dict[str, Any]) -> str:
    return sha256_hex({"sql": arguments.get(recipe.sql)})


def taken_by(recipe: recipes.Recipe, arguments: dict[str, Any], earlier: dict[str, Any] | None) -> bool:
    """Whether `earlier` was read the way `recipe` reads the record for this call."""
    if earlier is not None and recipe.sql is not None:
        return earlier.get("statements") == statements_digest(recipe, arguments)
    if earlier is None or recipe.read is None or earlier.get("tool") != recipe.read.tool:
        return False
    try:
        read_arguments = recipes.read_arguments(recipe, arguments)
    except BindingError:
        read_arguments = {}
    return (earlier.get("arguments") == read_arguments and earlier.get("versionAt") == recipe.version
            and earlier.get("ignoreOrder") == recipe.version_ignores_order
            and earlier.get("versionPattern") == recipe.version_pattern)


async def before(upstreams: Upstreams, needs: NeedsRead, arguments: dict[str, Any], owner) -> dict[str, Any]:
    """What the step keeps of the record just before the call (`recipes.earlier_state`)."""
    recipe = needs.recipe
    if recipe.sql is not None:
        return await statements_before(needs.server, recipe, arguments)
    try:
        read_arguments = recipes.read_arguments(recipe, arguments)
    except BindingError as exc:
        return {"tool": recipe.read.tool, "arguments": {}, "error": f"the read's arguments: {exc}"}
    limit, touches = settings.RECORDER_INLINE_RESULT_BYTES, recipe_chains.touched(recipe, arguments)
    try:
        result = await upstreams.call_tool(endpoint_of(needs.server), recipe.read.tool, read_arguments,
                                           owner=owner)
    except ToolServerError as exc:
        return await asyncio.to_thread(recipes.earlier_state, recipe, arguments=read_arguments,
                                       error=exc.message, limit=limit, touches=touches)
    # Off the event loop: digests and the recipe's patterns run over a text the agent may have written.
    return await asyncio.to_thread(recipes.earlier_state, recipe, arguments=read_arguments, result=result,
                                   limit=limit, touches=touches)


async def statements_before(server: ToolServer, recipe: recipes.Recipe, arguments: dict[str, Any]) -> dict:
    """What a database server's SQL would do, read against its database just before it is sent."""
    text = arguments.get(recipe.sql)
    if not isinstance(text, str):
        state = {"database": {"problem": f"its statements ({recipe.sql}) are not text"}}
    elif not server.database:
        state = {"database": {"problem": f"no database is registered for {server.name}, so its statements "
                              "could not be read against one (manage.py add_tool_server NAME --update "
                              "--database …)"}}
    else:
        state = await asyncio.to_thread(database.before_call, server.database, text, split=recipe.split,
                                        keeps_connection=recipe.keeps_connection,
                                        listed_safe=recipe.safe_functions)
    return {"tool": recipe.tool, "statements": statements_digest(recipe, arguments), **state}


def refused(earlier: dict[str, Any] | None) -> str | None:
    """Why a call's statements are never sent (they touch the capture, the server would run other statements
    than were read, or they leave a transaction to a later call), or None."""
    found = (earlier or {}).get("database")
    reading = found.get("reading") if isinstance(found, dict) else None
    if not isinstance(reading, dict) or reading.get("kind") != "refused":
        return None
    worst = next((s for s in reading.get("statements", ()) if s.get("kind") == "refused"), {})
    if worst.get("verb") == "touches the capture":
        return (f"Refused: {worst.get('reason', 'it touches the capture')}. Statements that touch the undo "
                "capture are never sent, whatever the policies say.")
    why = worst.get("reason", "it cannot be run as it was read")
    return f"Refused: {why}. This is never sent, whatever the policies say."


def touches_capture(earlier: dict[str, Any] | None) -> bool:
    reading = ((earlier or {}).get("database") or {}).get("reading") or {}
    return any(s.get("verb") == "touches the capture" for s in reading.get("statements", ()))


def in_window(earlier: dict[str, Any] | None) -> bool:
    """Whether a call is a database server's SQL, to be sent inside its database's window: every such call,
    reads included (what the database did is what the capture kept, whatever the statements read as), but
    those refused, which are never sent."""
    found = (earlier or {}).get("database")
    return isinstance(found, dict) and (found.get("reading") or {}).get("kind") != "refused"


def _read_kind(earlier: dict[str, Any]) -> str:
    return ((earlier.get("database") or {}).get("reading") or {}).get("kind") or "unknown"


# One SQL call at a time per database in this process, waited for on the event loop (so calls queued for a
# busy database hold no thread); `windows` adds the lock across processes.
_WINDOW_LOCKS: dict[str, asyncio.Lock] = {}


async def window(server: ToolServer, earlier: dict[str, Any] | None) -> windows.Window | None:
    """The database's window for an SQL call (`in_window`), opened just before it is sent (it waits for any
    other such call to the same database); None for any other call. An agent that hangs up while it waits
    leaves nothing held: the window, once opened, is let go at once."""
    if not server.database or not in_window(earlier):
        return None
    lock = _WINDOW_LOCKS.setdefault(server.database, asyncio.Lock())
    await lock.acquire()
    loop = asyncio.get_running_loop()
    job = asyncio.ensure_future(asyncio.to_thread(windows.opened, server.database))
    try:
        opened = await asyncio.shield(job)
    except asyncio.CancelledError:
        job.add_done_callback(lambda done: (
            windows.release(done.result()) if not done.cancelled() and done.exception() is None else None,
            loop.call_soon_threadsafe(lock.release)))
        raise
    except Exception:  # unreachable, or refused the lock: the step says its rows were not read (`rows_after`)
        lock.release()
        return None
    opened.on_release = lambda: loop.call_soon_threadsafe(lock.release)
    return opened


def misread(found: dict[str, Any]) -> str:
    """What a call read as a read did, in words: "read as a read, but the database changed 5 rows of
    contacts"."""
    return f"read as a read, but the database says it {rows.changed_words(found.get('tables') or {})}"


async def rows_after(opened_window: windows.Window | None, earlier: dict[str, Any] | None,
                     server_name: str = "", *, unanswered: bool = False) -> dict | None:
    """The rows the call changed, read from the capture right after it, the window closed: what the record
    keeps as the call's (`{"database": …}`), or None for a call that opened no window. `unanswered`: the
    call failed and may have acted (a timeout): the window is held until its statement has ended."""
    if opened_window is None:
        return {"database": {"problem": "its database could not be reached to read the rows it changed"}} \
            if in_window(earlier) else None
    kind = _read_kind(earlier)
    # A row change's rows are those of the tables it names (on SQLite, others are another writer's); any
    # other call's are all its own: the reading did not foresee them.
    tables = [t for s in earlier["database"]["reading"].get("statements", ())
              for t in (*s.get("writes", ()), *s.get("triggers", ()))] if kind == "rows" else None
    # A call that went unanswered (it timed out) may still be running on the database: its window waits.
    settle = settings.RECORDER_DATABASE_SETTLE_SECONDS if unanswered else 0
    texts = [s.get("text") or "" for s in earlier["database"].get("reading", {}).get("statements", ())]
    found = await asyncio.to_thread(windows.closed, opened_window, tables=tables,
                                    keep=settings.RECORDER_DATABASE_ROWS_KEPT, settle=settle, texts=texts)
    if kind == "read" and found.get("count"):
        found["misread"] = misread(found)
        metrics.ROWS_MISREAD.labels(server=server_name).inc(found["count"])
        logger.warning("%s: a call read as a read changed rows: %s", server_name, found["misread"])
    if kept := earlier["database"].get("kept"):  # tables kept before an approved destruction: did it happen?
        try:
            found["destroyed"] = await asyncio.to_thread(snapshots.destroyed, opened_window.place, kept)
        except database.DatabaseUnreachable as exc:
            found["problem"] = f"whether it destroyed what was kept could not be read after the call: {exc}"
    return {"database": found}


async def after(upstreams: Upstreams, server: ToolServer, earlier: dict[str, Any] | None,
                owner) -> tuple[str, Any]:
    """The record's version just after the call, read exactly as before it, and what was read (kept, within
    the bound, to show a later conflict three ways); ("", None) when there was no earlier state to compare
    with or the read fails (then the undo has no version, and a person decides)."""
    if not earlier or "version" not in earlier:
        return "", None
    try:
        return await read_state(upstreams, endpoint_of(server), earlier, owner=owner,
                                limit=settings.RECORDER_INLINE_RESULT_BYTES)
    except (ToolServerError, ValueError):
        return "", None


async def again(journal, upstreams: Upstreams, opened, arguments: dict[str, Any], owner):
    """A held call, approved: its record read again just before it is sent, since it may have changed
    while the call waited (`services.read_again`). Returns the step as it goes on, and a refusal when the
    record can no longer be read as the recipe needs (the approval was for an undoable call: nothing is
    sent, and the agent may ask again)."""
    kept = opened.earlier or {}
    recipe = needs_read(opened.server, opened.tool) if kept.get("version") or "database" in kept else None
    if recipe is None:
        return opened, None
    earlier = await before(upstreams, NeedsRead(server=opened.server, recipe=recipe), arguments, owner)
    found = earlier.get("database") or {}
    if ("version" not in earlier and recipe.sql is None) or earlier.get("problem") or found.get("problem") \
            or refused(earlier):
        why = earlier.get("error") or earlier.get("problem") or found.get("problem") or refused(earlier) or (
            "its answer has no version")
        message = (f"Not done: after the approval, {opened.server.name} could no longer be read as the undo "
                   f"of this call needs ({why}). Nothing was sent; make the call again to ask anew.")
        advice = failed("policy", opened.traits, held="lapsed")
        await journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now(),
                          advice=advice.as_wire())
        return opened, (message, advice)
    # A person approved a destruction: the tables it destroys are kept first.
    if recipe.sql is not None and (keep := snapshots.keepable_of(found)):
        try:
            found["kept"] = await asyncio.to_thread(snapshots.take, opened.server.database, keep)
        except database.DatabaseUnreachable as exc:
            tables = ", ".join(k["table"] for k in keep)
            message = (f"Not done: the approval was for a call that destroys {tables}, and the Recorder "
                       f"keeps such a table before sending it, which failed ({exc}). Nothing was sent; make "
                       "the call again to ask anew.")
            advice = failed("policy", opened.traits, held="lapsed")
            await journal.run(services.refuse_step, opened=opened, message=message, now=timezone.now(),
                              advice=advice.as_wire())
            return opened, (message, advice)
    await journal.run(services.read_again, run_id=opened.run_id, step_id=opened.step_id,
                      number=opened.number, earlier=earlier, now=timezone.now())
    return dataclasses.replace(opened, earlier=earlier), None

