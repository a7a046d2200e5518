from django.apps import AppConfig


class ApproverConfig(AppConfig):
    name = "approver"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imported here, as Django's app loading requires (models are ready only now), not to dodge a loop.
        from journal import ports

        from . import tasks  # noqa: F401 - registers the tasks the doorbell rings by name, in every process
        from .authority import approvals_for_bundle
        from .services.held_calls import HeldCallGate
        from .story import Story

        # The Recorder asks the approval side through these; the journal itself never imports it.
        ports.install(gate=HeldCallGate(), signed_decisions=approvals_for_bundle, story=Story())
