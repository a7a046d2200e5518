"""What must follow a change that is not made through the journal's services: a person deactivated in
Django's own user admin (or an agent in ours) loses every OAuth token a client holds for them at once
(`services.clients.end_tokens_of_inactive`), and a public OAuth client (registered by itself, or in the
toolkit's admin) is kept with no secret. Connected when the app is ready (`journal.apps`)."""

from django.contrib.auth import get_user_model
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver
from oauth2_provider.models import get_application_model

from ..models import Agent
from ..services import clients


@receiver(post_save, sender=get_user_model(), dispatch_uid="journal.end_tokens_of_an_inactive_person")
def person_saved(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        clients.end_tokens_of_inactive(user=instance)


@receiver(post_save, sender=Agent, dispatch_uid="journal.end_tokens_of_an_inactive_agent")
def agent_saved(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        clients.end_tokens_of_inactive(agent=instance)


@receiver(pre_save, sender=get_application_model(), dispatch_uid="journal.no_secret_for_a_public_client")
def client_saving(sender, instance, **kwargs) -> None:
    """A public client authenticates with no secret (PKCE is its proof), yet the toolkit generates one for
    every client and hashes it: work an anonymous registration should not cost, for a secret nobody uses."""
    if instance.client_type == sender.CLIENT_PUBLIC and instance.hash_client_secret:
        instance.client_secret, instance.hash_client_secret = "", False
