from django.apps import AppConfig


class JournalConfig(AppConfig):
    name = "journal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from .auth import receivers  # noqa: F401 - connects them; models are ready only now
        from .telemetry import tracing

        # Traces, when the OTEL_* variables ask for them: before Django loads its middleware, which the
        # Django instrumentation adds to.
        tracing.configure()
