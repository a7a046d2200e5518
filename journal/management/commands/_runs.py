import uuid

from django.core.management.base import CommandError

from journal.models import Run


def find_run(text: str) -> Run:
    try:
        public_id = uuid.UUID(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a run id (a UUID, as shown in the run's URL).") from None
    run = Run.objects.filter(public_id=public_id).first()
    if run is None:
        raise CommandError(f"No run {public_id}.")
    return run
