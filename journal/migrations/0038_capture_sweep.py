from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("journal", "0037_dbhub_split")]
    operations = [
        migrations.AddField(model_name="toolserver", name="capture_swept_to",
                            field=models.BigIntegerField(default=0)),
        migrations.AddField(model_name="toolserver", name="unrecorded",
                            field=models.JSONField(blank=True, default=list)),
        migrations.AddField(model_name="toolserver", name="capture_horizon",
                            field=models.JSONField(blank=True, default=dict)),
    ]
