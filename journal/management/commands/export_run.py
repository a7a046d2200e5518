import json
from pathlib import Path

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
        bundle = services.export_bundle(run=find_run(run))
        text = json.dumps(bundle, indent=1, ensure_ascii=False)
        if output:
            output.write_text(text, encoding="utf-8")
            self.stderr.write(f"Wrote {len(bundle['entries'])} entries to {output}")
        else:
            self.stdout.write(text)
