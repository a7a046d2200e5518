from django.core.management.base import BaseCommand, CommandError

from journal import services as journal_services
from journal.models import ToolServer
from journal.upstream import database


class Command(BaseCommand):
    help = ("Put the undo capture in place on a database server's tables: row-level triggers that keep every "
            "row an agent changes, before and after, so each change can be undone row by row. Without "
            "--tables or --all, says which tables are captured.")

    def add_arguments(self, parser):
        parser.add_argument("name", help="The database server, as registered (add_tool_server … --database).")
        parser.add_argument("--tables", default="", help="The tables to capture, comma-separated.")
        parser.add_argument("--all", action="store_true", help="Capture every table that has a primary key.")
        parser.add_argument("--sql", action="store_true",
                            help="Print the SQL for a DBA to run instead of running it.")
        parser.add_argument("--prune", action="store_true",
                            help="Forget the captured rows no undo needs any more (the worker does it "
                                 "hourly).")
        parser.add_argument("--agent-role", action="append", default=[], dest="agent_roles",
                            help="PostgreSQL: a role the agent's server connects as, kept out of the capture "
                                 "(repeat for several).")

    def handle(self, name, tables, all, sql, agent_roles, prune=False, **options):
        server = ToolServer.objects.filter(name=name).first()
        if server is None:
            raise CommandError(f"There is no tool server named {name!r}.")
        if not server.database:
            raise CommandError(f"{name} has no database registered: add_tool_server {name} --update "
                               "--database URL first.")
        chosen = None if all else [t.strip() for t in tables.split(",") if t.strip()]
        try:
            if prune:
                forgotten = journal_services.prune_capture(server=server)
                self.stdout.write(f"{server.name}: forgot {forgotten:,} captured row"
                                  f"{'' if forgotten == 1 else 's'} no undo needs any more.")
                return
            if not all and not chosen:
                return self._status(server)
            if sql:
                text, captured = database.capture_sql(server.database, chosen, agent_roles=agent_roles)
                self.stdout.write(f"-- The undo capture of {server.name}: {', '.join(captured)}\n{text}")
                return
            captured, note = database.install(server.database, chosen, agent_roles=agent_roles)
        except (database.CannotCapture, database.DatabaseUnreachable) as exc:
            raise CommandError(str(exc)) from None
        tables_word = f"{len(captured)} table{'' if len(captured) == 1 else 's'}"
        self.stdout.write(f"{server.name}: the capture keeps every change to "
                          f"{', '.join(captured) or 'no table'} ({tables_word}).")
        if note:
            self.stderr.write(self.style.WARNING(note))
        self._reached(server, captured)

    def _reached(self, server: ToolServer, tables) -> None:
        """Say which tables a captured table's changes reach that are not captured: until they are, such a
        change waits for a person."""
        with database.connected(server.database) as connection:
            captured = database.captured(connection)
            for table in tables:
                if missing := database.reached_uncaptured(connection, table, captured):
                    self.stdout.write(self.style.WARNING(
                        f"{table}: changing its rows also changes {', '.join(missing)}, not captured: "
                        "capture those too, or such changes wait for a person."))

    def _status(self, server: ToolServer) -> None:
        with database.connected(server.database) as connection:
            every = database.keys(connection)
            captured = database.captured(connection)
        bare = sorted(name for name in every if not name.startswith("main.") and (
            connection.dialect != "postgresql" or "." in name))
        for table in bare:
            if table in captured:
                words = "captured"
            elif not every[table]:
                words = "not captured: it has no primary key"
            else:
                words = "not captured"
            self.stdout.write(f"{table}: {words}")
        self._reached(server, [t for t in bare if t in captured])
        for finding in server.unrecorded:
            self.stdout.write(self.style.WARNING(
                f"Changed by no recorded call: {journal_services.unrecorded_words(finding)}, between "
                f"{finding['since']} and {finding['until']} (capture ids {finding['from']} to "
                f"{finding['to']})."))
