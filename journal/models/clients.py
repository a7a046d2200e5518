"""What OAuth clients are to the Recorder: the agent a person let a client act as, and the authorization
codes already exchanged (`journal.services.clients`)."""

from django.conf import settings
from django.db import models
from django.utils import timezone
from oauth2_provider.settings import oauth2_settings


class ClientAuthorization(models.Model):
    """A person let an OAuth client (an MCP client that takes only a URL) act as one of their agents
    (`journal.auth.oauth`): every token that client holds for that person is this agent's, and is journaled
    under it. One agent per client and person; revoking the authorization ends each of those tokens at
    once."""

    application = models.ForeignKey(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="client_authorizations"
    )
    agent = models.ForeignKey("journal.Agent", on_delete=models.CASCADE,
                              related_name="client_authorizations")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)  # to within a minute

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["application", "user"], name="one_agent_per_client_and_person")
        ]

    def __str__(self):
        return f"{self.application_id} as {self.agent_id} for {self.user_id}"


class RedeemedCode(models.Model):
    """An OAuth authorization code that was exchanged for tokens, kept as its SHA-256 with what it gave: a
    second exchange of it means it leaked, and ends every token it gave (RFC 6749 section 4.1.2,
    `services.clients.code_replayed`). Kept as long as the refresh tokens it gave could live."""

    code_digest = models.CharField(max_length=64, unique=True)
    application = models.ForeignKey(
        oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    access_token_checksum = models.CharField(max_length=64)
    token_family = models.UUIDField(null=True, blank=True)  # the refresh tokens rotated from it
    redeemed_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return f"code {self.code_digest[:8]} of {self.application_id}"
