"""The audit stream's loop: one thread per sink in each Recorder process (or `manage.py audit_stream`), the
holder of the sink's lease sending, the others waiting to take over.

Each turn reads the next entries of the runs that are behind (in seq order per run, a fair share of the
batch each), sends them, and only then records how far each run got (`AuditPosition`), conditionally on
still holding the lease. A process killed between the send and that write sends the same entries again
when it (or another) takes over: at least once, in order per run, a duplicate recognisable by its run and
seq. Per run, entries are committed in seq order under the run's lock, so no entry can appear behind one
already read.
"""

import contextlib
import logging
import os
import secrets
import socket
import threading
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ..models import AuditPosition, AuditSink, ChainEntry, Notice, Run
from ..record import chain
from ..telemetry import metrics
from .sinks import Event, NotDelivered, sink_for

logger = logging.getLogger(__name__)

LEASE_SECONDS = 30
IDLE_SECONDS = 0.5
BATCH = 500
RUNS_A_TURN = 50
_NONCE = secrets.token_hex(4)


def holder_id() -> str:
    """Who holds a lease: this host, this process, and this start of it."""
    return f"{socket.gethostname()}:{os.getpid()}:{_NONCE}"


def claim(name: str, me: str, now: datetime) -> bool:
    """Take or renew the lease on sink `name`; True when this process holds it now. A holder that is a
    process of this host that no longer runs is taken over at once (a Recorder killed and started again);
    one elsewhere, once its lease has run out."""
    with contextlib.suppress(IntegrityError), transaction.atomic():
        AuditSink.objects.get_or_create(name=name)
    until = now + timedelta(seconds=LEASE_SECONDS)
    free = Q(holder=me) | Q(holder="") | Q(held_until__lt=now)
    if AuditSink.objects.filter(free, name=name).update(holder=me, held_until=until):
        return True
    holder = AuditSink.objects.filter(name=name).values_list("holder", flat=True).first() or ""
    return _gone_from_here(holder) and bool(
        AuditSink.objects.filter(name=name, holder=holder).update(holder=me, held_until=until))


def _gone_from_here(holder: str) -> bool:
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def release(name: str, me: str) -> None:
    """Let go of the lease (a process stopping), so another process takes over at once."""
    AuditSink.objects.filter(name=name, holder=me).update(holder="", held_until=None)


def delivered_seq(sink_id: int):
    """How far each run has been delivered to the sink (0 for a run never sent), as an annotation."""
    return Coalesce(Subquery(AuditPosition.objects.filter(sink_id=sink_id, run=OuterRef("pk"))
                             .values("seq")[:1]), 0)


def behind(sink_id: int):
    """The runs with entries the sink has not had."""
    return Run.objects.annotate(done=delivered_seq(sink_id)).filter(head_seq__gt=F("done"))


def next_batch(sink_id: int, limit: int = BATCH) -> list[Event]:
    """The next entries to send, in seq order per run: a fair share of `limit` for each run behind, the
    longest-waiting runs first; then the notices not sent yet, in id order, in what is left of `limit`."""
    runs = list(behind(sink_id).order_by("pk").values_list(
        "pk", "public_id", "done", "agent__name", "agent_label", "team__name")[:RUNS_A_TURN])
    share = max(limit // max(len(runs), 1), 1)
    events: list[Event] = []
    for pk, public_id, done, agent, label, team in runs:
        rows = (ChainEntry.objects.filter(run_id=pk, seq__gt=done).order_by("seq")
                .values_list("seq", "ts", "event", "data", "prev_hash", "hash")[:share])
        events += [Event(run=str(public_id), seq=seq, ts=ts, event=event, data=data, prev_hash=prev,
                         hash=digest, agent=agent or label, team=team or "")
                   for seq, ts, event, data, prev, digest in rows]
    return events + notices_after(sink_id, max(limit - len(events), 0))


def notices_after(sink_id: int, limit: int) -> list[Event]:
    """The notices the sink has not had, in id order, at most `limit`."""
    done = AuditSink.objects.filter(pk=sink_id).values_list("notices_to", flat=True).get()
    rows = Notice.objects.filter(pk__gt=done).order_by("pk").values_list(
        "pk", "at", "event", "data", "server_name")[:limit]
    return [Event(run="", seq=0, ts=chain.format_ts(at), event=event, data=data, prev_hash="", hash="",
                  agent="", team="", notice=pk, server=server) for pk, at, event, data, server in rows]


def advance(name: str, me: str, events: list[Event], now: datetime) -> bool:
    """Record that `events` were delivered (each run up to its last), if this process still holds the
    lease; False when it lost it meanwhile (the new holder sends from where the record says)."""
    last: dict[str, int] = {}
    for event in events:
        if not event.notice:
            last[event.run] = max(last.get(event.run, 0), event.seq)
    notices_to = max((event.notice for event in events), default=0)
    runs = dict(Run.objects.filter(public_id__in=list(last)).values_list("public_id", "pk"))
    with transaction.atomic():
        sink = AuditSink.objects.select_for_update().filter(name=name, holder=me).first()
        if sink is None:
            return False
        for public_id, pk in runs.items():
            seq = last[str(public_id)]
            if not AuditPosition.objects.filter(sink=sink, run_id=pk).update(seq=Greatest(F("seq"), seq)):
                AuditPosition.objects.create(sink=sink, run_id=pk, seq=seq)
        AuditSink.objects.filter(pk=sink.pk).update(
            delivered=F("delivered") + len(events), last_delivered_at=now,
            notices_to=Greatest(F("notices_to"), notices_to),
            held_until=now + timedelta(seconds=LEASE_SECONDS))
    return True


class Streamer:
    """The audit stream in this process: a thread per sink (`sinks.sink_for`), started and stopped with the
    process."""

    def __init__(self, sinks: list):
        self.sinks = sinks
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._serve, args=(sink,), name=f"audit {sink.name}",
                                         daemon=True) for sink in sinks]
        self.me = holder_id()

    def start(self) -> "Streamer":
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout)

    def _serve(self, sink) -> None:
        failures = 0
        try:
            while not self.stopping.is_set():
                try:
                    pause, failures = self.turn(sink, failures)
                except Exception:  # the database, most likely: said, and tried again
                    logger.exception("the audit stream to %s failed; trying again", sink.name)
                    connection.close()
                    pause, failures = min(2 ** failures, 30), failures + 1
                self.stopping.wait(pause)
            with contextlib.suppress(Exception):
                release(sink.name, self.me)
        finally:
            sink.close()
            connection.close()

    def turn(self, sink, failures: int) -> tuple[float, int]:
        """One turn: (how long to wait before the next, the failures in a row so far)."""
        now = timezone.now()
        if not claim(sink.name, self.me, now):
            return LEASE_SECONDS / 3, 0
        sink_id = AuditSink.objects.filter(name=sink.name).values_list("pk", flat=True).get()
        events = next_batch(sink_id)
        if not events:
            return IDLE_SECONDS, 0
        try:
            sink.send(events)
        except NotDelivered as refused:
            logger.warning("the audit stream could not deliver to %s: %s", sink.name, refused.message)
            metrics.AUDIT_FAILURES.labels(sink.name).inc()
            AuditSink.objects.filter(name=sink.name).update(last_error=refused.message[:1000],
                                                            last_error_at=now)
            return min(2 ** failures, 30), failures + 1
        if advance(sink.name, self.me, events, timezone.now()):
            metrics.AUDIT_DELIVERED.labels(sink.name).inc(len(events))
        return 0, 0


def started() -> Streamer | None:
    """The audit stream of this process, started, for the sinks AUDIT_STREAM names (None for none); a sink
    that cannot be used stops the process with ImproperlyConfigured, saying why."""
    if not settings.AUDIT_STREAM:
        return None
    try:
        sinks = [sink_for(address, secret=settings.AUDIT_WEBHOOK_SECRET, production=settings.PRODUCTION)
                 for address in settings.AUDIT_STREAM]
    except ValueError as exc:
        raise ImproperlyConfigured(f"AUDIT_STREAM: {exc}") from None
    return Streamer(sinks).start()
