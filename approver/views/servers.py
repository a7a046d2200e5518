"""Tool servers, for admins only: where each tool's undo comes from (its server's own declaration, an
admin's recipe, or nothing), putting a recipe pack in force, writing one recipe with a preview against a
past call, and every change to a server's recipes (`approver.services.recipes`)."""

import json

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from journal.auth import roles
from journal.auth.access import require_role
from journal.models import ToolServer
from journal.services import RecipesRefused, names_too_long, unrecorded_words
from journal.undo import recipes
from journal.undo.packs import PACKS

from .. import services
from ..forms import PackForm, RecipeForm

# The kinds of undo (`journal.undo.recipes.explain`), as an admin reads them.
KIND_WORDS = {"compensate": "Undone by a compensation", "none": "Cannot be undone",
              "read_only": "Only reads: nothing to undo", "unknown": "Not known"}


def _tools(server: ToolServer) -> list[dict]:
    """Each tool the server lists, with the kind of its undo and where that comes from, in words."""
    rows = []
    for tool in server.catalogue:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            kind, why = recipes.explain(tool, server.recipe(tool["name"]), server.catalogue)
            rows.append({"name": tool["name"], "kind": kind, "kind_words": KIND_WORDS.get(kind, kind),
                         "why": why, "has_recipe": server.recipe(tool["name"]) is not None})
    return rows


@require_GET
def server_list(request):
    require_role(request, roles.ADMIN)
    servers = []
    for server in ToolServer.objects.order_by("name"):
        kinds = [row["kind"] for row in _tools(server)]
        servers.append({"server": server, "tools": len(kinds), "compensate": kinds.count("compensate"),
                        "unknown": kinds.count("unknown")})
    return render(request, "approver/server_list.html", {"servers": servers})


def _skeleton(server: ToolServer, tool: str) -> str:
    """The recipe editor's starting text: the tool's recipe in force, or one to fill in for it."""
    raw = server.recipe(tool) or {
        "tool": tool, "schemaDigest": recipes.schema_digest(server.tool(tool)), "kind": "compensate",
        "does": "", "compensation": {"tool": "", "arguments": {}}}
    return json.dumps(raw, indent=2, ensure_ascii=False)


def _page(request, server: ToolServer, *, recipe_form=None, preview=None, status=200):
    tool = request.GET.get("tool", "")
    if recipe_form is None:
        recipe_form = RecipeForm(initial={"recipe": _skeleton(server, tool)} if tool in server.tool_names
                                 else None)
    return render(request, "approver/server_detail.html", {
        "server": server, "tools": _tools(server),
        "pack_form": PackForm(packs=sorted(PACKS), initial={"pack": server.recipe_pack or None}),
        "recipe_form": recipe_form, "preview": preview, "editing": tool,
        "changes": services.recipe_changes(server), "too_long": names_too_long(server),
        "unrecorded": [(unrecorded_words(f), f) for f in reversed(server.unrecorded)],
    }, status=status)


@require_GET
def server_detail(request, server_id):
    require_role(request, roles.ADMIN)
    return _page(request, get_object_or_404(ToolServer, pk=server_id))


@require_POST
def server_pack(request, server_id):
    """Put a pack in force ("use"), or take every recipe off the server ("off")."""
    require_role(request, roles.ADMIN)
    server = get_object_or_404(ToolServer, pk=server_id)
    if "off" in request.POST:
        services.recipes_off(server=server, by=request.user)
        messages.success(request, f"{server.name} has no recipes now: its tools are as undoable as it says.")
        return redirect("approver:server_detail", server.pk)
    form = PackForm(request.POST, packs=sorted(PACKS))
    if not form.is_valid():
        messages.error(request, "Choose one of the packs.")
        return redirect("approver:server_detail", server.pk)
    used = services.use_pack(server=server, pack=form.cleaned_data["pack"], by=request.user,
                             needs_human=form.cleaned_data["needs_human"])
    messages.success(request, f"The {form.cleaned_data['pack']} pack is in force on {server.name} for "
                              f"{len(used.applied)} tool{'s' if len(used.applied) != 1 else ''}.")
    for tool, problems in used.skipped.items():
        messages.warning(request, f"{tool}: not applied: {'; '.join(problems)}")
    return redirect("approver:server_detail", server.pk)


@require_http_methods(["POST"])
def server_recipe(request, server_id):
    """"Preview" tries the recipe against the tool's latest journaled call; "Save" puts it in force. Both
    check it against the server's catalogue first, and say what does not fit."""
    require_role(request, roles.ADMIN)
    server = get_object_or_404(ToolServer, pk=server_id)
    form = RecipeForm(request.POST)
    preview = None
    if form.is_valid():
        raw = form.cleaned_data["recipe"]
        try:
            if "save" in request.POST:
                services.save_recipe(server=server, raw=raw, by=request.user)
                messages.success(request, f"The recipe for {raw.get('tool')} is in force on {server.name}. "
                                          "It applies from the next call.")
                return redirect("approver:server_detail", server.pk)
            preview = services.preview(server=server, raw=raw)
        except RecipesRefused as refused:
            form.add_error("recipe", str(refused))
    return _page(request, server, recipe_form=form, preview=preview, status=200 if form.is_valid() else 400)


@require_POST
def server_recipe_remove(request, server_id):
    require_role(request, roles.ADMIN)
    server = get_object_or_404(ToolServer, pk=server_id)
    tool = request.POST.get("tool", "")
    if server.recipe(tool) is None:
        messages.error(request, f"{server.name} has no recipe for {tool!r}.")
    else:
        services.remove_recipe(server=server, tool=tool, by=request.user)
        messages.success(request, f"The recipe for {tool} is removed: it is as undoable as {server.name} "
                                  "says.")
    return redirect("approver:server_detail", server.pk)
