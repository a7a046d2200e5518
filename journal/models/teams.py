"""Teams: who owns which agents. A person sees, plans and signs only for their teams' agents (admins see
every team's); the reads are `journal.auth.teams`, the writes `journal.services.teams`."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class TeamQuerySet(models.QuerySet):
    def default(self) -> "Team":
        """The team an agent joins when nobody chose one (`DEFAULT_TEAM`): made the first time it is needed,
        counting everyone with a role as a member, as the upgrade's one team does."""
        team, _ = self.get_or_create(name=settings.DEFAULT_TEAM, defaults={
            "title": settings.DEFAULT_TEAM.capitalize(), "everyone": True})
        return team


class Team(models.Model):
    name = models.SlugField(max_length=60, unique=True, help_text=(
        "Short name: what the identity provider's groups are mapped to (OIDC_GROUPS) and the API shows."))
    title = models.CharField(max_length=100, blank=True)
    # The upgrade puts every agent in one team that counts everyone with a role as a member, so nothing
    # changes until an admin makes teams of their own and turns this off.
    everyone = models.BooleanField(default=False, help_text=(
        "Everyone with a role (on-call, approver, admin) is a member, whoever is listed."))
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="teams")
    created_at = models.DateTimeField(default=timezone.now)

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.title or self.name
