from django.db import migrations, models


def runs_of_plans(apps, schema_editor):
    """Every plan so far covers its one run."""
    Plan = apps.get_model("approver", "Plan")
    Through = Plan.runs.through
    Through.objects.bulk_create(
        [Through(plan_id=pk, run_id=run_id) for pk, run_id in Plan.objects.values_list("pk", "run_id")],
        batch_size=1000)


class Migration(migrations.Migration):
    dependencies = [
        ("approver", "0017_recipe_then"),
        ("journal", "0022_step_failure_unsupported"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="plan",
            name="runs",
            field=models.ManyToManyField(blank=True, related_name="undo_plans", to="journal.run"),
        ),
        migrations.RunPython(runs_of_plans, migrations.RunPython.noop),
    ]
