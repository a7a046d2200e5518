"""What must follow a change that is not made through the journal's services: a person deactivated in
Django's own user admin (or an agent in ours) loses every OAuth token a client holds for them at once
(`services.clients.end_tokens_of_inactive`). Connected when the app is ready (`journal.apps`)."""

from django.contrib.auth import get_user_model
from django.db.models.signals import post_save
from django.dispatch import receiver

from .models import Agent
from .services import clients


@receiver(post_save, sender=get_user_model(), dispatch_uid="journal.end_tokens_of_an_inactive_person")
def person_saved(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        clients.end_tokens_of_inactive(user=instance)


@receiver(post_save, sender=Agent, dispatch_uid="journal.end_tokens_of_an_inactive_agent")
def agent_saved(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        clients.end_tokens_of_inactive(agent=instance)
