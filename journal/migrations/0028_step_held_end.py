from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("journal", "0027_step_record_json"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="held_end",
            field=models.CharField(
                blank=True,
                choices=[
                    ("told", "The agent was told it awaits approval"),
                    ("hung_up", "The agent stopped waiting"),
                    ("lost", "The Recorder holding it stopped"),
                    ("denied", "Denied"),
                    ("lapsed", "The approval expired or was used"),
                ],
                max_length=8,
            ),
        ),
    ]
