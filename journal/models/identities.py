"""Who a person is at the company's identity provider: the provider's subject (`sub`), which never changes
for them, unlike an email address (`journal.auth.oidc`)."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class ProviderIdentity(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="provider_identity")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_person_per_subject")]

    def __str__(self):
        return f"{self.subject} at {self.issuer}"
