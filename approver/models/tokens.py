"""Personal API tokens: a person's own, for a script or an incident tool to do what they may do in the
browser, but sign (signing stays in the browser with a passkey)."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class PersonalTokenQuerySet(models.QuerySet):
    def live(self, now=None):
        return self.filter(revoked_at__isnull=True, expires_at__gt=now or timezone.now())


class PersonalToken(models.Model):
    """Shown once when made; only its SHA-256 is kept. It acts with its person's roles and teams as they are
    at each request (a role or a team taken away is taken from the token too), within its scope."""

    class Scope(models.TextChoices):
        READ = "read", "Read runs, steps and plans"
        UNDO = "undo", "Read, and ask for undo plans, pause, resume, abort and cancel them"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What it is for, to tell tokens apart.")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to tell tokens apart.")
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.READ)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = PersonalTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.name} ({self.user}, {self.prefix}…)"

    def is_live(self, now=None) -> bool:
        return self.revoked_at is None and self.expires_at > (now or timezone.now())
