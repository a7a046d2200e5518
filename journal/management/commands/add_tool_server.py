from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from journal import services
from journal.models import ToolServer


class Command(BaseCommand):
    help = "Register a tool server (streamable HTTP URL or stdio command) and read its catalogue."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Short name; its tools appear to agents as NAME__tool.")
        parser.add_argument("url", nargs="?", default="", help="Streamable HTTP endpoint, e.g. http://localhost:8100/crm/mcp")
        parser.add_argument(
            "--command",
            dest="stdio_command",
            default="",
            help='stdio: the command line, e.g. "uvx mcp-server-time"',
        )
        parser.add_argument(
            "--update", action="store_true", help="Change the URL or command of an existing server."
        )
        parser.add_argument("--alias", default=None,
                            help="A shorter prefix for its tools as agents see them (ALIAS__tool), where "
                                 "NAME__tool would be over the 64 characters model APIs accept; '' clears "
                                 "it.")
        parser.add_argument("--recipes", metavar="PACK", default="",
                            help="Put a recipe pack in force for its tools (filesystem, memory, git): see "
                                 "`manage.py recipes`.")

    def handle(self, name, url, stdio_command, update, recipes="", alias=None, **options):
        existing = ToolServer.objects.filter(name=name).first()
        if existing and not update:
            raise CommandError(f"A tool server named {name!r} exists. Use --update to change it.")
        only_alias = existing and alias is not None and not url and not stdio_command
        if bool(url) == bool(stdio_command) and not only_alias:
            raise CommandError("Give either a URL or --command, not both and not neither.")
        try:
            if existing:
                address = {} if only_alias else {"url": url, "command": stdio_command}
                server = services.save_tool_server(server=existing, alias=alias, **address)
            else:
                server = services.register_tool_server(name=name, url=url, command=stdio_command,
                                                       alias=alias or "")
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        server = services.refresh_catalogue(server=server)
        if server.catalogue_error:
            self.stderr.write(self.style.WARNING(server.catalogue_error))
        prefix = f" (agents see them as {server.alias}__tool)" if server.alias else ""
        self.stdout.write(f"{server.name}: {len(server.catalogue)} tools{prefix}")
        if too_long := services.names_too_long(server):
            self.stderr.write(self.style.WARNING(too_long))
        if recipes:
            # By name: the recipes are changed, and logged, by the approval side's command.
            call_command("recipes", name, use=recipes, stdout=self.stdout, stderr=self.stderr)
        if server.catalogue_error:  # kept, so it can be fixed with --update; but a script must hear of it
            raise CommandError(f"{server.name} is registered, but its tools could not be read, so agents see "
                               f"none of them: fix its address (--update) or start it, then run this again.")
