from functools import partial
from pathlib import Path
from types import SimpleNamespace

from django.core.management.base import BaseCommand

from journal import services

from ._runs import find_run


class Command(BaseCommand):
    help = ("Write a run's record (entries, signed checkpoints, public keys) as a bundle anyone can verify "
            "offline.")

    def add_arguments(self, parser):
        parser.add_argument("run", help="The run's id (UUID).")
        parser.add_argument("-o", "--output", type=Path, help="File to write (default: standard output).")

    def handle(self, run, output, **options):
        run = find_run(run)
        if output:
            with output.open("w", encoding="utf-8") as out:
                written = services.write_bundle(run=run, out=out)
            self.stderr.write(f"Wrote {written} entries to {output}")
        else:
            services.write_bundle(run=run, out=SimpleNamespace(write=partial(self.stdout.write, ending="")))
