"""Admins' undo recipes for the tool servers that declare nothing (`journal.recipes`): enabling a pack,
writing one recipe, removing one, turning them off. Each change is made through the journal's one writer of a
server's recipes and recorded in the policies' change log (who, when, before, after), in one transaction: a
recipe decides what the autonomy policies see as undoable, so it is a policy change."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from journal import packs
from journal import services as journal_services
from journal.models import ToolServer

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


def use_pack(*, server: ToolServer, pack: str, by, now: datetime | None = None) -> PackUsed:
    """Put a pack's recipes in force for the server, replacing its recipes: those that fit its catalogue;
    the rest are named with why (KeyError for a pack that does not exist)."""
    fitting, skipped = [], {}
    for raw in packs.pack(pack):
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
