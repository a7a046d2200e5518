import json
import sys

from django.core.management.base import BaseCommand

from approver import health


class Command(BaseCommand):
    help = "Report the database, the broker and the workers as JSON; exit 1 when anything is not ok."

    def handle(self, **options):
        body = health.report()
        self.stdout.write(json.dumps(body))
        if body["status"] != "ok":
            sys.exit(1)
