"""Admins' undo recipes for the tool servers that declare nothing (`journal.undo.recipes`): enabling a pack,
writing one recipe, removing one, turning them off. Each change is made through the journal's one writer of a
server's recipes and recorded in the policies' change log (who, when, before, after), in one transaction: a
recipe decides what the autonomy policies see as undoable, so it is a policy change."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from journal import services as journal_services
from journal.models import Step, ToolServer
from journal.undo import packs, recipes
from journal.undo.bindings import BindingError, resolve_runtime_expression
from journal.undo.recipe_text import brief

from ..models import PolicyChange
from .policies import log_change

RECIPES_CHANGED = "recipes_changed"


@dataclass(frozen=True)
class PackUsed:
    """What enabling a pack did: the tools whose recipes are now in force, and those of the pack that do not
    fit this server (its tool is missing, or its schema is not the pinned one), with why."""

    applied: list[str]
    skipped: dict[str, list[str]] = field(default_factory=dict)


def _change(server: ToolServer, raw: list[dict[str, Any]], pack: str, by, now: datetime | None) -> None:
    now = now or timezone.now()
    with transaction.atomic():
        locked = ToolServer.objects.select_for_update().get(pk=server.pk)
        before, after = journal_services.set_recipes(server=locked, raw=raw, pack=pack, by=by.get_username(),
                                                     now=now)
        if before != after:
            log_change(RECIPES_CHANGED, by=by, now=now, before=before, after=after)
    server.refresh_from_db()


def use_pack(*, server: ToolServer, pack: str, by, now: datetime | None = None,
             needs_human: bool = True) -> PackUsed:
    """Put a pack's recipes in force for the server, replacing its recipes: those that fit its catalogue;
    the rest are named with why (KeyError for a pack that does not exist). With `needs_human` False, the
    admin lets the pack's undos run under the plan policies instead of always waiting for a person."""
    fitting, skipped = [], {}
    for raw in packs.pack(pack):
        if not needs_human and raw.get("kind") == "compensate":
            raw = {**raw, "needsHuman": False}
        if problems := journal_services.recipe_problems(server=server, raw=[raw]):
            skipped[raw["tool"]] = problems
        else:
            fitting.append(raw)
    _change(server, fitting, pack, by, now)
    return PackUsed(applied=[raw["tool"] for raw in fitting], skipped=skipped)


def save_recipe(*, server: ToolServer, raw: dict[str, Any], by, now: datetime | None = None) -> None:
    """Put one recipe in force (replacing the tool's earlier one). RecipesRefused says why it cannot be."""
    tool = raw.get("tool") if isinstance(raw, dict) else None
    others = [r for r in server.recipes if r.get("tool") != tool]
    _change(server, [*others, raw], server.recipe_pack, by, now)


def remove_recipe(*, server: ToolServer, tool: str, by, now: datetime | None = None) -> None:
    _change(server, [r for r in server.recipes if r.get("tool") != tool], server.recipe_pack, by, now)


def recipes_off(*, server: ToolServer, by, now: datetime | None = None) -> None:
    """No recipes for this server: its tools are as undoable as it says itself."""
    _change(server, [], "", by, now)


def changes(server: ToolServer, *, last: int = 30) -> list[PolicyChange]:
    """The change log's entries for this server's recipes, newest first."""
    mentions = Q(data__after__server=server.name) | Q(data__before__server=server.name)
    return list(PolicyChange.objects.filter(mentions, event=RECIPES_CHANGED).order_by("-seq")[:last])


@dataclass(frozen=True)
class Preview:
    """What a recipe would do for the latest journaled call of its tool: the step, and each compensating
    call in one line (or why it would not undo it)."""

    step: Step | None
    calls: list[str]
    says: str = ""


BEFORE = "‹what the Recorder reads just before the call›"


def preview(*, server: ToolServer, raw: Any) -> Preview:
    """A recipe tried against the latest successful call of its tool on this server. RecipesRefused when the
    recipe does not fit the server (the same reasons as on save)."""
    if problems := journal_services.recipe_problems(server=server, raw=[raw]):
        raise journal_services.RecipesRefused("; ".join(problems))
    recipe = recipes.Recipe.model_validate(raw)
    step = (Step.objects.filter(server=server, tool=recipe.tool, status=Step.Status.OK)
            .select_related("run").order_by("-finished_at", "-id").first())
    if step is None:
        return Preview(None, [], f"No call of {recipe.tool} has been journaled on {server.name} yet.")
    if recipe.kind != "compensate":
        return Preview(step, [], "It would say the call cannot be undone" + (
            f": {recipe.reason}" if recipe.reason else "."))
    earlier = step.earlier_state or {}
    documents = {"request": step.arguments, "response": _structured(step),
                 "before": earlier.get("structured") if "structured" in earlier else None}
    calls, says = [], ""
    for call in recipe.calls:
        arguments = {}
        for name, expression in call.arguments.items():
            try:
                arguments[name] = resolve_runtime_expression(expression, **documents)
            except BindingError as exc:
                if documents["before"] is None and "$before.body" in str(expression):
                    arguments[name] = BEFORE
                else:
                    says = f"For this call the binding of {call.tool} {name} does not resolve: {exc}"
                    arguments[name] = "‹does not resolve›"
        calls.append(brief(call.tool, arguments))
    return Preview(step, calls, says)


def _structured(step: Step) -> Any:
    """The step's `structuredContent`, as the server sent it."""
    result = journal_services.step_result(step)
    return result.get("structuredContent") if result is not None else None
