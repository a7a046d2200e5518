"""One row per distinctive value of a run (its most recent step and how often it was seen) instead of one
per step that had it: inference stays one lookup per argument value however long the run is. Existing
values are carried over."""

import django.db.models.deletion
from django.db import migrations, models


def carry_over(apps, schema_editor):
    ResultValue = apps.get_model("journal", "ResultValue")
    RunValue = apps.get_model("journal", "RunValue")
    latest: dict = {}
    for run_id, digest, step_id, pointer in (
        ResultValue.objects.order_by("step_id", "id")
        .values_list("run_id", "digest", "step_id", "pointer")
        .iterator()
    ):
        kept = latest.get((run_id, digest))
        if kept is None:
            latest[(run_id, digest)] = [step_id, pointer, 1]
        elif kept[0] != step_id:
            latest[(run_id, digest)] = [step_id, pointer, kept[2] + 1]
    RunValue.objects.bulk_create(
        [
            RunValue(run_id=run_id, digest=digest, step_id=step_id, pointer=pointer, seen=seen)
            for (run_id, digest), (step_id, pointer, seen) in latest.items()
        ],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [("journal", "0006_step_result_storage")]

    operations = [
        migrations.CreateModel(
            name="RunValue",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("digest", models.CharField(max_length=32)),
                ("pointer", models.CharField(max_length=500)),
                ("seen", models.PositiveIntegerField(default=1)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="journal.run"
                    ),
                ),
                (
                    "step",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="journal.step"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "digest"), name="one_value_per_run")]
            },
        ),
        migrations.RunPython(carry_over, migrations.RunPython.noop),
        migrations.DeleteModel(name="ResultValue"),
    ]
