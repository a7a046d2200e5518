"""DBHub's SQL tool, put in force by the dbhub pack before the pack said how DBHub cuts a text and that it
keeps its connection between calls: said now, so its calls are read as DBHub runs them (issue 58)."""

from django.db import migrations

DBHUB_EXECUTE_SQL = "350fb021e6ede0128f13d7fbd4604f0978cc9f112b8aeddd9842aa8480a79f7c"


def say_how_dbhub_runs(apps, schema_editor):
    ToolServer = apps.get_model("journal", "ToolServer")
    for server in ToolServer.objects.exclude(recipes=[]):
        changed = False
        for recipe in server.recipes:
            if (isinstance(recipe, dict) and recipe.get("kind") == "sql"
                    and recipe.get("schemaDigest") == DBHUB_EXECUTE_SQL and "split" not in recipe):
                recipe.update(split="dbhub", keepsConnection=True)
                changed = True
        if changed:
            ToolServer.objects.filter(pk=server.pk).update(recipes=server.recipes)


class Migration(migrations.Migration):
    dependencies = [("journal", "0036_audit_stream")]
    operations = [migrations.RunPython(say_how_dbhub_runs, migrations.RunPython.noop)]
