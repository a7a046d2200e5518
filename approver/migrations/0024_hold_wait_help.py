from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approver", "0023_undo_keys_across_runs"),
    ]

    operations = [
        migrations.AlterField(
            model_name="autonomypolicy",
            name="ask_timeout",
            field=models.PositiveIntegerField(
                default=60,
                help_text="Seconds an agent's held call waits inside its request for a decision, at most: "
                "the Recorder tells the agent it awaits approval after RECORDER_HOLD_WAIT_SECONDS (4) at the "
                "latest.",
            ),
        ),
    ]
