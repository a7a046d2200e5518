"""How far behind the audit stream is, per sink, for `/metrics`: the entries committed and not yet delivered,
and how long the oldest of them has waited."""

from datetime import datetime

from django.conf import settings
from django.db.models import Count, F, Min, OuterRef, Subquery, Sum
from prometheus_client.core import GaugeMetricFamily

from ..models import AuditSink, ChainEntry, Notice
from .sinks import shown
from .stream import behind


def families(now: datetime):
    """`undo_audit_lag_entries` and `undo_audit_lag_seconds` for every configured sink (a sink that never
    started is behind by everything)."""
    entries = GaugeMetricFamily("undo_audit_lag_entries", "Journal entries committed and not yet delivered "
                                "to the audit sink.", labels=["sink"])
    seconds = GaugeMetricFamily("undo_audit_lag_seconds", "How long the oldest entry not yet delivered to "
                                "the audit sink has waited.", labels=["sink"])
    for address in settings.AUDIT_STREAM:
        name = shown(address)
        sink_id = AuditSink.objects.filter(name=name).values_list("pk", flat=True).first()
        count, waited = lag(sink_id or 0, now)
        entries.add_metric([name], count)
        seconds.add_metric([name], waited)
    yield entries
    yield seconds


def lag(sink_id: int, now: datetime) -> tuple[int, float]:
    """(entries behind, seconds the oldest of them has waited) for the sink `sink_id` (0: none yet)."""
    runs = behind(sink_id)
    first = Subquery(ChainEntry.objects.filter(run=OuterRef("pk"), seq=OuterRef("done") + 1).values("ts")[:1])
    found = runs.annotate(first=first).aggregate(entries=Sum(F("head_seq") - F("done")), oldest=Min("first"))
    done = AuditSink.objects.filter(pk=sink_id).values_list("notices_to", flat=True).first() or 0
    notices = Notice.objects.filter(pk__gt=done).aggregate(count=Count("pk"), oldest=Min("at"))
    count = int(found["entries"] or 0) + notices["count"]
    if not count:
        return 0, 0.0
    oldest = [moment for moment in (
        datetime.fromisoformat(found["oldest"]) if found["oldest"] else None, notices["oldest"]) if moment]
    return count, max((now - min(oldest, default=now)).total_seconds(), 0.0)
