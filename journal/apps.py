from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from .auth import receivers  # noqa: F401 - connects them; models are ready only now
