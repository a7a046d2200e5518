"""Record leases between plans: from its first approval until it ends, a plan holds a lease on each record it
will change, and another plan's item on a held record waits for it."""

from django.conf import settings
from django.db import models

from .plans import Plan


class RecordLeaseQuerySet(models.QuerySet):
    def open(self):
        return self.filter(released_at__isnull=True)

    def held(self):
        return self.open().filter(held_since__isnull=False)


class RecordLease(models.Model):
    """One plan's hold on one record (a server's resource), or its place in the queue for it.

    At most one plan holds a record at a time (the constraint below settles two plans approved at the same
    moment); the others wait, oldest first, and are handed the record when it is released: when the holder
    ends, is cancelled or rejected, when the approvals that took it expire, or when an admin breaks it."""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="leases")
    server = models.CharField(max_length=200)
    resource = models.CharField(max_length=500)
    asked_at = models.DateTimeField()
    held_since = models.DateTimeField(null=True, blank=True)  # None while another plan holds the record
    until = models.DateTimeField(null=True, blank=True)  # when the approvals that took it expire
    # Another plan held the record when this one asked: its item is checked again before it runs.
    waited = models.BooleanField(default=False)
    rechecked = models.BooleanField(default=False)
    released_at = models.DateTimeField(null=True, blank=True)
    released_why = models.CharField(max_length=200, blank=True)
    broken_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                                  related_name="+")
    break_reason = models.TextField(blank=True)

    objects = RecordLeaseQuerySet.as_manager()

    class Meta:
        ordering = ["asked_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["server", "resource"],
                condition=models.Q(held_since__isnull=False, released_at__isnull=True),
                name="one_holder_per_record",
            ),
            models.UniqueConstraint(
                fields=["plan", "server", "resource"],
                condition=models.Q(released_at__isnull=True),
                name="one_open_lease_per_plan_record",
            ),
        ]

    def __str__(self):
        return f"{self.plan}'s lease on {self.server} {self.resource}"

    @property
    def is_held(self) -> bool:
        return self.held_since is not None and self.released_at is None
