"""`manage.py audit_stream`: the audit stream in a process of its own, for a deployment that keeps it out
of the web processes (each Recorder process streams too, whoever holds a sink's lease sends). Runs until
stopped (Ctrl-C or SIGTERM), then lets go of its leases."""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from journal.audit import stream


class Command(BaseCommand):
    help = "Stream every journal entry to the sinks AUDIT_STREAM names, until stopped."

    def handle(self, *args, **options):
        if not settings.AUDIT_STREAM:
            raise CommandError("AUDIT_STREAM names no sink: set it to where the audit stream goes.")
        stopped = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopped.set())
        streamer = stream.started()
        names = ", ".join(sink.name for sink in streamer.sinks)
        self.stdout.write(f"Streaming the record to {names}; Ctrl-C stops.")
        stopped.wait()
        streamer.stop()
