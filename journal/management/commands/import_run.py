from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from journal import services
from journal.models import Team
from journal.record import strict_json
from journal.record.bundle import ImportRefused


class Command(BaseCommand):
    help = "Import a run bundle from another Recorder, or a ChronoMCP audit log (JSONL), after verifying it."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--format", choices=["auto", "bundle", "chronomcp"], default="auto")
        parser.add_argument("--team", default="", help="The team the run belongs to (default: DEFAULT_TEAM).")

    def handle(self, file, format, team, **options):
        chosen = None
        if team:
            chosen = Team.objects.filter(name=team).first()
            if chosen is None:
                raise CommandError(f"No team is named {team!r}. Nothing was imported.")
        try:
            if format == "auto":
                format = "bundle" if _looks_like_bundle(file) else "chronomcp"
            if format == "bundle":
                run = services.import_bundle(path=file, team=chosen)
            else:
                run = services.import_chronomcp_log(text=file.read_text(encoding="utf-8"), source=file.name,
                                                       team=chosen)
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"Cannot read {file}: {exc}") from None
        except ImportRefused as exc:
            raise CommandError(f"Refused {file.name}: {exc}. Nothing was imported.") from None
        self.stdout.write(f"Imported run {run.public_id}: {run.step_count} steps, {run.head_seq} entries.")


# A ChronoMCP line longer than this is taken for a bundle's start (a bundle's first line is short).
_FIRST_LINE = 1 << 20


def _looks_like_bundle(file: Path) -> bool:
    """A ChronoMCP log is one object per line, each with a "kind"; anything else is taken as a bundle, whose
    reader says clearly what is wrong with it. Only the first line is read here, and strictly."""
    with file.open(encoding="utf-8", errors="replace") as text:
        first = ""
        while not first.strip():
            first = text.readline(_FIRST_LINE)
            if not first:
                return True
    try:
        document = strict_json.loads(first, max_bytes=len(first) * 4 + 1)
    except strict_json.JsonRefused:
        return True
    return not (isinstance(document, dict) and "kind" in document and "format" not in document)
