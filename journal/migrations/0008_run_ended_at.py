from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("journal", "0007_run_value")]

    operations = [
        migrations.AddField(
            model_name="run", name="ended_at", field=models.DateTimeField(blank=True, null=True)
        ),
    ]
