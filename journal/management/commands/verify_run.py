import sys

from django.core.management.base import BaseCommand

from journal import services

from ._runs import find_run


class Command(BaseCommand):
    help = (
        "Check a run's hash chain and signed checkpoints. Exits 0 when intact, 1 naming the first bad entry."
    )

    def add_arguments(self, parser):
        parser.add_argument("run", help="The run's id (UUID).")

    def handle(self, run, **options):
        verdict = services.verify_run(run=find_run(run))
        if verdict.ok:
            self.stdout.write(f"OK: {verdict}")
            return
        self.stderr.write(f"BROKEN: {verdict}")
        sys.exit(1)
