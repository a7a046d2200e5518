"""The audit stream's own state: each sink (a SIEM's syslog, a signed webhook, OTLP logs), which process
streams to it now (a lease), and how far each run's record has been delivered to it."""

from django.db import models


class AuditSink(models.Model):
    """A destination of the audit stream, by its address without credentials (`AUDIT_STREAM`). One process
    at a time streams to it: the holder of its lease, renewed as it goes."""

    name = models.CharField(max_length=300, unique=True)
    holder = models.CharField(max_length=200, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    delivered = models.PositiveBigIntegerField(default=0)  # events delivered, every run together
    last_delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    notices_to = models.PositiveBigIntegerField(default=0)  # every notice up to this id has been delivered

    def __str__(self):
        return f"audit sink {self.name}"


class AuditPosition(models.Model):
    """How far run `run`'s record has been delivered to `sink`: every entry up to `seq`, in order."""

    sink = models.ForeignKey(AuditSink, on_delete=models.CASCADE, related_name="positions")
    run = models.ForeignKey("journal.Run", on_delete=models.CASCADE, related_name="+")
    seq = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sink", "run"], name="one_position_per_sink_run")]

    def __str__(self):
        return f"{self.sink.name}: run {self.run_id} up to {self.seq}"


class Notice(models.Model):
    """Something the audit stream says that is no run's: rows a database's capture kept that no recorded call
    made (`capture_unrecorded`), found by the capture's sweep. Sent in id order after the runs' entries; ids
    are taken one writer at a time (`services.notices.notify`), so none commits behind one already read."""

    at = models.DateTimeField()
    event = models.CharField(max_length=60)
    server = models.ForeignKey("journal.ToolServer", on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="+")
    server_name = models.CharField(max_length=60, blank=True)
    data = models.JSONField(default=dict)

    def __str__(self):
        return f"notice {self.pk}: {self.event} ({self.server_name})"
