from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from journal import services
from journal.models import ToolServer


class Command(BaseCommand):
    @staticmethod
    def _saved(existing, *, name, url, command, alias, database) -> ToolServer:
        """The server registered, or changed (only its alias or database, when no address is given)."""
        settings_only = existing and (alias is not None or database is not None) and not url and not command
        if bool(url) == bool(command) and not settings_only:
            raise CommandError("Give either a URL or --command, not both and not neither.")
        try:
            if existing:
                address = {} if settings_only else {"url": url, "command": command}
                return services.save_tool_server(server=existing, alias=alias, database=database, **address)
            return services.register_tool_server(name=name, url=url, command=command, alias=alias or "",
                                                 database=database or "")
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None

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
                            help="Put a recipe pack in force for its tools (filesystem, memory, git, sqlite, "
                                 "dbhub, postgres): see `manage.py recipes`.")
        parser.add_argument("--database", metavar="URL", default=None,
                            help="For a database server: the database its SQL acts on, as the Recorder "
                                 "reaches it with its own credentials (postgresql://user:password@host/db, "
                                 "or an SQLite file's path); '' clears it.")

    def handle(self, name, url, stdio_command, update, recipes="", alias=None, database=None, **options):
        existing = ToolServer.objects.filter(name=name).first()
        if existing and not update:
            raise CommandError(f"A tool server named {name!r} exists. Use --update to change it.")
        server = self._saved(existing, name=name, url=url, command=stdio_command, alias=alias,
                             database=database)
        server = services.refresh_catalogue(server=server)
        if server.catalogue_error:
            self.stderr.write(self.style.WARNING(server.catalogue_error))
        prefix = f" (agents see them as {server.alias}__tool)" if server.alias else ""
        self.stdout.write(f"{server.name}: {len(server.catalogue)} tools{prefix}")
        if server.database:
            self.stdout.write(f"{server.name}: its SQL acts on {server.database_shown}")
        if too_long := services.names_too_long(server):
            self.stderr.write(self.style.WARNING(too_long))
        if recipes:
            # By name: the recipes are changed, and logged, by the approval side's command.
            call_command("recipes", name, use=recipes, stdout=self.stdout, stderr=self.stderr)
        if server.catalogue_error:  # kept, so it can be fixed with --update; but a script must hear of it
            raise CommandError(f"{server.name} is registered, but its tools could not be read, so agents see "
                               f"none of them: fix its address (--update) or start it, then run this again.")
