import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("journal", "0008_run_ended_at")]

    operations = [
        migrations.CreateModel(
            name="AgentSession",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("session_id", models.CharField(max_length=100, unique=True)),
                ("protocol_version", models.CharField(max_length=20)),
                ("client_info", models.JSONField(default=dict)),
                ("capabilities", models.JSONField(default=dict)),
                ("opened_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("last_used_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "agent",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="sessions",
                        to="journal.agent",
                    ),
                ),
            ],
        ),
    ]
