import getpass
import json

from django.core.management.base import BaseCommand, CommandError

from approver import services
from journal import services as journal_services
from journal.models import ToolServer
from journal.undo import recipes
from journal.undo.packs import PACKS


class CommandLine:
    """Who changed the recipes, for the change log, when it was done from a shell."""

    def get_username(self) -> str:
        return f"{getpass.getuser()} (command line)"


class Command(BaseCommand):
    help = ("List where the undo of each tool of a registered server comes from (its own declaration, an "
            "admin's recipe, or nothing) and why; with --use PACK or --off, change its recipes first.")

    def add_arguments(self, parser):
        parser.add_argument("name", help="The tool server's name.")
        change = parser.add_mutually_exclusive_group()
        change.add_argument("--use", metavar="PACK", choices=sorted(PACKS),
                            help=f"Put a recipe pack in force: {', '.join(sorted(PACKS))}.")
        change.add_argument("--off", action="store_true", help="No recipes for this server.")
        parser.add_argument("--under-policies", action="store_true",
                            help="With --use: let the pack's undos run under the plan policies, instead of "
                                 "always waiting for a person's signature.")
        parser.add_argument("--json", action="store_true", help="Print the recipes in force as JSON.")

    def handle(self, name, use, off, json: bool = False, under_policies: bool = False, **options):
        if under_policies and not use:
            raise CommandError("--under-policies goes with --use PACK.")
        server = ToolServer.objects.filter(name=name).first()
        if server is None:
            raise CommandError(f"No tool server named {name!r}.")
        if use:
            used = services.use_pack(server=server, pack=use, by=CommandLine(),
                                     needs_human=not under_policies)
            self.stdout.write(f"{name}: the {use} pack is in force for {len(used.applied)} tools.")
            for tool, problems in used.skipped.items():
                self.stderr.write(self.style.WARNING(f"  {tool}: not applied: {'; '.join(problems)}"))
        elif off:
            services.recipes_off(server=server, by=CommandLine())
            self.stdout.write(f"{name}: no recipes.")
        if json:
            self.stdout.write(_json(server.recipes))
            return
        self._list(server)

    def _list(self, server: ToolServer) -> None:
        pack = f"the {server.recipe_pack} pack" if server.recipe_pack else "no pack"
        changed = (f", changed by {server.recipes_changed_by} {server.recipes_changed_at:%Y-%m-%d %H:%M}"
                   if server.recipes_changed_at else "")
        self.stdout.write(f"{server.name}: {pack}, {len(server.recipes)} recipes{changed}")
        for tool in server.catalogue:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            kind, why = recipes.explain(tool, server.recipe(tool["name"]), server.catalogue)
            self.stdout.write(f"  {tool['name']:<28} {kind:<11} {why}")
        for problem in journal_services.recipe_problems(
                server=server, raw=[r for r in server.recipes if r.get("tool") not in server.tool_names]):
            self.stdout.write(self.style.WARNING(f"  {problem}"))


def _json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
