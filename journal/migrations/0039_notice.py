import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("journal", "0038_capture_sweep")]
    operations = [
        migrations.AddField(model_name="auditsink", name="notices_to",
                            field=models.PositiveBigIntegerField(default=0)),
        migrations.CreateModel(
            name="Notice",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("at", models.DateTimeField()),
                ("event", models.CharField(max_length=60)),
                ("server_name", models.CharField(blank=True, max_length=60)),
                ("data", models.JSONField(default=dict)),
                ("server", models.ForeignKey(blank=True, null=True,
                                             on_delete=django.db.models.deletion.SET_NULL,
                                             related_name="+", to="journal.toolserver")),
            ],
        ),
    ]
