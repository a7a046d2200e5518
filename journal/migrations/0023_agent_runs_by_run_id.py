from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("journal", "0022_step_failure_unsupported"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agent",
            name="runs_by",
            field=models.CharField(
                choices=[
                    ("session", "per MCP session (else by the idle gap)"),
                    ("idle", "by the idle gap, across sessions"),
                    ("run_id", "by its runId only (a call without one is a run of its own)"),
                ],
                default="session",
                max_length=10,
            ),
        ),
    ]
