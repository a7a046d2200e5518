from django.core.management.base import BaseCommand

from journal import services
from journal.models import ToolServer


class Command(BaseCommand):
    help = "Read the catalogue of every enabled tool server again (or only those named)."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*")

    def handle(self, names, **options):
        servers = ToolServer.objects.filter(enabled=True)
        if names:
            servers = servers.filter(name__in=names)
        for server in servers:
            server = services.refresh_catalogue(server=server)
            status = server.catalogue_error or "ok"
            self.stdout.write(f"{server.name}: {len(server.catalogue)} tools ({status})")
