"""Teams. An existing installation gets one team holding every agent and run, which counts everyone with a
role as a member: nothing changes until an admin makes teams of their own."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def one_team_holds_everything(apps, schema_editor):
    Team = apps.get_model("journal", "Team")
    name = settings.DEFAULT_TEAM
    team, _ = Team.objects.get_or_create(name=name, defaults={"title": name.capitalize(), "everyone": True})
    apps.get_model("journal", "Agent").objects.update(team=team)
    apps.get_model("journal", "Run").objects.update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ("journal", "0033_tool_server_database"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(
                    auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.SlugField(help_text=(
                    "Short name: what the identity provider's groups are mapped to (OIDC_GROUPS) and the API "
                    "shows."), max_length=60, unique=True)),
                ("title", models.CharField(blank=True, max_length=100)),
                ("everyone", models.BooleanField(default=False, help_text=(
                    "Everyone with a role (on-call, approver, admin) is a member, whoever is listed."))),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("members", models.ManyToManyField(
                    blank=True, related_name="teams", to=settings.AUTH_USER_MODEL)),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.AddField(
            model_name="agent", name="team",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="agents",
                to="journal.team"),
        ),
        migrations.AddField(
            model_name="run", name="team",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="runs",
                to="journal.team"),
        ),
        migrations.RunPython(one_team_holds_everything, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="agent", name="team",
            field=models.ForeignKey(
                help_text="Its team's people see its runs, undo them and approve.",
                on_delete=django.db.models.deletion.PROTECT, related_name="agents", to="journal.team"),
        ),
        migrations.AlterField(
            model_name="run", name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="runs", to="journal.team"),
        ),
    ]
