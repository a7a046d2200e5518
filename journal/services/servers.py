"""Tool servers: every write to their rows (the command, the admin and the demo alike) and their
catalogues."""

import logging
from datetime import datetime
from typing import Any

import anyio
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..errors import Refused
from ..models import Step, ToolServer
from ..models.servers import SEPARATOR
from ..record import chain
from ..record.canonical import to_ijson
from ..telemetry import metrics
from ..undo import declarations, recipes
from ..upstream import captured, snapshots, unrecorded
from ..upstream.client import ToolServerError, Upstreams, endpoint_of
from . import notices, record

logger = logging.getLogger(__name__)


def register_tool_server(*, name: str, url: str = "", command: str = "", alias: str = "",
                         database: str = "") -> ToolServer:
    """A new tool server, reached over streamable HTTP at `url` or started as the stdio `command`, its tools
    offered to agents as `alias__tool` if it has an alias; for a database server, the `database` its SQL
    acts on, as the Recorder reaches it. ValidationError names what is wrong."""
    return save_tool_server(server=ToolServer(name=name, alias=alias, database=database), url=url,
                            command=command)


def save_tool_server(*, server: ToolServer, url: str | None = None, command: str | None = None,
                     alias: str | None = None, database: str | None = None) -> ToolServer:
    """Keep a tool server's row, new or changed (its URL or command, if given; the transport follows from
    them; its alias and database, if given), after Django's validation. The one writer of the row: the
    command, the admin and the demo."""
    if alias is not None:
        server.alias = alias
    if database is not None:
        server.database = database
    moved = False
    if url is not None or command is not None:
        moved = server.pk is not None and (server.url, server.command) != (url or "", command or "")
        server.url, server.command = url or "", command or ""
        server.transport = ToolServer.Transport.STDIO if server.command else ToolServer.Transport.HTTP
    if moved:  # the tools of the old address are not this one's: none are offered until it is read
        server.catalogue, server.catalogue_fetched_at = [], None
        server.catalogue_error = "Its address changed and its catalogue has not been read from the new one."
    server.full_clean()
    server.save()
    return server


class RecipesRefused(Refused):
    """Recipes that do not fit the server: the message says which, and why."""


# Model APIs (OpenAI's, Anthropic's) refuse a tool whose name is longer than this: an agent's framework
# then fails on the whole tool list, not on the one tool.
MODEL_TOOL_NAME_LIMIT = 64


def names_too_long(server: ToolServer) -> str:
    """What to say when some of the server's tools, named `prefix__tool` as agents see them, are longer than
    model APIs take ("" when none is): which, and the alias (a shorter prefix) that would fit them."""
    long = sorted(name for tool in server.tool_names
                  if len(name := f"{server.prefix}__{tool}") > MODEL_TOOL_NAME_LIMIT)
    if not long:
        return ""
    room = MODEL_TOOL_NAME_LIMIT - 2 - max(len(name) - len(server.prefix) - 2 for name in long)
    shown = ", ".join(long[:3]) + (f" and {len(long) - 3} more" if len(long) > 3 else "")
    if room > 0:
        alias = suggested_alias(server, room)
        advice = (f"give it an alias of at most {room} characters, the prefix agents then see (such as "
                  f"{alias!r}: on its admin page, or manage.py add_tool_server {server.name} --update "
                  f"--alias {alias})")
    else:
        advice = "its own tool names are too long for any prefix; ask its maintainers"
    return (f"{len(long)} of {server.name}'s tools are named longer than the {MODEL_TOOL_NAME_LIMIT} "
            f"characters model APIs accept ({shown}): an agent's framework may refuse its whole tool list. "
            f"To fix it, {advice}.")


def suggested_alias(server: ToolServer, room: int) -> str:
    """A free alias of at most `room` characters for `server`: its name's start, numbered if that is taken."""
    taken = set(ToolServer.objects.exclude(pk=server.pk).values_list("name", flat=True)) | set(
        ToolServer.objects.exclude(pk=server.pk).exclude(alias="").values_list("alias", flat=True))
    stem = server.name.replace(SEPARATOR, "-")[:room].strip("-_") or "s"
    candidates = [stem] + [f"{stem[:max(1, room - len(str(n)))]}{n}" for n in range(2, 1000)]
    return next((alias for alias in candidates if alias not in taken and len(alias) <= room), stem)


def recipe_problems(*, server: ToolServer, raw: list[dict[str, Any]]) -> list[str]:
    """Why these recipes cannot be the server's: each must parse, fit its current catalogue, and be the
    only recipe for its tool."""
    found, seen = [], set()
    for entry in raw:
        recipe, problems = recipes.parse(entry)
        tool = entry.get("tool") if isinstance(entry, dict) else None
        if recipe is not None:
            problems = recipes.problems(recipe, server.catalogue)
            if recipe.tool in seen:
                problems = [*problems, "a second recipe for the same tool"]
            seen.add(recipe.tool)
        found.extend(f"{tool or '(recipe)'}: {problem}" for problem in problems)
    return found


def set_recipes(*, server: ToolServer, raw: list[dict[str, Any]], pack: str, by: str,
                now: datetime | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Put these recipes in force for the server (all of them, replacing what was), after checking each
    against its catalogue; RecipesRefused says why not. Returns what was and what is, as the change log
    keeps them; the caller holds the transaction that logs it (`approver.services.recipes`)."""
    if problems := recipe_problems(server=server, raw=raw):
        raise RecipesRefused("; ".join(problems))
    before = recipes_record(server)
    server.recipes, server.recipe_pack = to_ijson(raw), pack
    server.recipes_changed_by, server.recipes_changed_at = by, now or timezone.now()
    server.save(update_fields=["recipes", "recipe_pack", "recipes_changed_by", "recipes_changed_at",
                               "updated_at"])
    return before, recipes_record(server)


def recipes_record(server: ToolServer) -> dict[str, Any]:
    """A server's recipes as the change log keeps them."""
    return {"server": server.name, "pack": server.recipe_pack, "recipes": server.recipes}


def save_catalogue(*, server: ToolServer, tools: list[dict[str, Any]] | None, error: str = "",
                   now: datetime | None = None) -> ToolServer:
    """Keep the raw catalogue and pin receipt keys on first sight; a key id that later changes its key is
    refused (and said so), because a server that swaps keys under the same id could forge old receipts."""
    now = now or timezone.now()
    if tools is None:
        if server.catalogue_fetched_at is None:  # never read from this address: nothing is offered
            error = f"{error} No tools are offered until its catalogue is read."
        server.catalogue_error = error
        server.save(update_fields=["catalogue_error", "updated_at"])
        return server
    tools = to_ijson(tools)
    problems = []
    pinned = dict(server.receipt_keys)
    for tool in tools:
        if not isinstance(tool, dict):
            problems.append("the catalogue has entries that are not tool objects; agents will not see them")
            continue
        journal = tool["_meta"].get(declarations.HATP_KEY) if isinstance(tool.get("_meta"), dict) else None
        published = journal.get("receiptKeys") if isinstance(journal, dict) else None
        for key in published if isinstance(published, list) else []:
            if not isinstance(key, dict) or key.get("alg") != "Ed25519":
                continue
            key_id, public = str(key.get("keyId", "")), str(key.get("publicKey", ""))
            if not key_id or not public:
                continue
            if key_id in pinned and pinned[key_id] != public:
                problems.append(f"receipt key {key_id} changed; the pinned key is kept")
                continue
            try:
                chain.public_key_from_text(public)
            except ValueError:
                problems.append(f"receipt key {key_id} is not an Ed25519 public key")
                continue
            pinned[key_id] = public
    server.catalogue = tools
    server.catalogue_fetched_at = now
    server.catalogue_error = "; ".join(sorted(set(problems)))
    server.receipt_keys = pinned
    server.save(
        update_fields=["catalogue", "catalogue_fetched_at", "catalogue_error", "receipt_keys", "updated_at"]
    )
    return server



def refresh_catalogue(*, server: ToolServer) -> ToolServer:
    """Read the server's raw `tools/list` and keep it. Called outside any transaction (it is network I/O),
    from commands, the admin and tests; the Recorder itself reads what was kept."""
    endpoint = endpoint_of(server)

    async def fetch():
        async with Upstreams(timeout=settings.TOOL_SERVER_TIMEOUT) as upstreams:
            return await upstreams.list_tools(endpoint)

    try:
        tools = anyio.run(fetch)
    except ToolServerError as exc:
        return save_catalogue(server=server, tools=None, error=f"Could not read the catalogue: {exc.message}")
    return save_catalogue(server=server, tools=tools)



def prune_capture(*, server: ToolServer, now: datetime | None = None) -> int:
    """Forget the rows of `server`'s database capture that no undo needs any more: those the Recorder has read
    into a step (the record keeps them, or their undo window closed), keeping every call's over the record's
    bound until its undo window closes, and the tables kept before an approved destruction until its undo
    window closes. How many rows were forgotten (0 for a server without a database)."""
    if not server.database:
        return 0
    now = now or timezone.now()
    swept_to = sweep_capture(server=server, now=now)  # nothing is forgotten before it was swept
    upto, needed, copies = 0, [], []
    steps = server.steps.filter(compensation_arguments__isnull=False).values_list(
        "compensation_arguments", "undo_by")
    for arguments, undo_by in steps.iterator():
        open_window = undo_by is None or undo_by > now
        if isinstance(arguments, dict) and not open_window:  # tables kept before a destruction, no longer
            copies += [k["copy"] for k in arguments.get("kept") or ()
                       if isinstance(k, dict) and isinstance(k.get("copy"), str)]
        if not isinstance(arguments, dict) or not isinstance(arguments.get("to"), int):
            continue
        upto = max(upto, arguments["to"])
        if arguments.get("inCapture") and open_window:
            needed.append((int(arguments.get("from") or 0), arguments["to"]))
    forgotten = snapshots.forget(server.database, copies) if copies else 0
    upto = min(upto, swept_to)
    return forgotten + (captured.prune(server.database, upto=upto, needed=needed) if upto else 0)


UNRECORDED_KEPT = 50
STILL_RUNNING_KEPT = 500  # the latest calls that gave up while their statement ran


def sweep_capture(*, server: ToolServer, now: datetime | None = None) -> int:
    """Read `server`'s capture since the last sweep against the windows of the calls the Recorder made to it
    (`journal.upstream.unrecorded`): rows no window holds are changes no recorded call made, kept as a
    finding on the server (its page shows them), counted in the metrics and logged; rows a call's own
    transaction committed after its window closed are that call's, said on its step and in its run's record
    (`committed_later`). Returns the change id swept to. DatabaseUnreachable when the database cannot be
    read."""
    now = now or timezone.now()
    # Only the windows that end past the last sweep can hold a row it has not read.
    ranges = server.steps.filter(earlier_state__left__database__to__gt=server.capture_swept_to).values_list(
        "earlier_state__left__database__from", "earlier_state__left__database__to")
    late, sessions = _still_running(server)
    swept = unrecorded.sweep(server.database, after=server.capture_swept_to, ranges=list(ranges),
                             lag_seconds=settings.RECORDER_CAPTURE_SWEEP_LAG_SECONDS,
                             horizon=server.capture_horizon, late=late, sessions=sessions)
    for step_id, rows in swept.attached.items():
        _committed_later(step_id, server, rows, now)
    findings = server.unrecorded
    if swept.rows:
        finding = swept.as_record(now.isoformat())
        if swept.probably:
            steps = {pk: (run, number) for pk, run, number in Step.objects.filter(
                pk__in=list(swept.probably)).values_list("pk", "run__public_id", "number")}
            finding["probably"] = [{"run": str(steps[p["step"]][0]), "step": steps[p["step"]][1],
                                    "rows": p["rows"]} for p in finding["probably"] if p["step"] in steps]
        findings = [*server.unrecorded, finding][-UNRECORDED_KEPT:]
    with transaction.atomic():  # the finding and its notice with the sweep's progress, or none of them
        if swept.rows:
            notices.notify(event="capture_unrecorded", server=server, now=now,
                           data={**finding, "words": f"{unrecorded_words(finding)} changed by no recorded "
                                                     f"call to {server.name}"})
        ToolServer.objects.filter(pk=server.pk).update(capture_swept_to=swept.upto, unrecorded=findings,
                                                       capture_horizon=swept.horizon)
    if swept.rows:
        metrics.ROWS_UNRECORDED.labels(server=server.name).inc(swept.rows)
        logger.warning("%s: %s changed by no recorded call (capture ids %s to %s)", server.name,
                       unrecorded_words(finding), swept.first, swept.last)
    server.capture_swept_to, server.unrecorded, server.capture_horizon = swept.upto, findings, swept.horizon
    return swept.upto


def _still_running(server: ToolServer) -> tuple[dict[int, int], dict[int, int]]:
    """The calls to `server` that gave up while their statement still ran (`windows.closed`): by the
    transaction id their own session had then, and by the pid of every session running then (step ids)."""
    late, sessions = {}, {}
    steps = server.steps.filter(earlier_state__left__database__has_key="running").order_by("-pk").values_list(
        "pk", "earlier_state__left__database__running")[:STILL_RUNNING_KEPT]
    for step_id, running in steps:
        for session in running if isinstance(running, list) else ():
            if not isinstance(session, dict):
                continue
            if isinstance(session.get("pid"), int):
                sessions.setdefault(session["pid"], step_id)
            if session.get("ours") and isinstance(session.get("xid"), int):
                late.setdefault(session["xid"], step_id)
    return late, sessions


def _committed_later(step_id: int, server: ToolServer, late: unrecorded.Late, now: datetime) -> None:
    """Rows the call of step `step_id` committed after it gave up: in its run's record and on the step."""
    words = (f"its transaction committed {unrecorded_words(late.as_record())} after the call gave up "
             f"(capture ids {late.first} to {late.last}); they are not in this step's undo")
    with transaction.atomic():
        step = Step.objects.select_for_update().get(pk=step_id)
        record.record_event(run_id=step.run_id, event="committed_later", now=now,
                            data={"step": step.number, "server": server.name, **late.as_record()})
        Step.objects.filter(pk=step_id).update(undo_problems=[*step.undo_problems, words])
    logger.warning("%s: step %s of run %s: %s", server.name, step.number, step.run_id, words)


def unrecorded_words(finding: dict) -> str:
    """"5 rows of public.contacts and 2 of public.companies"."""
    parts = [f"{n:,} row{'' if n == 1 else 's'} of {table}" for table, n in finding.get("tables", {}).items()]
    return "; ".join(parts) or "no rows"
