from django.apps import AppConfig


class ApproverConfig(AppConfig):
    name = "approver"
    default_auto_field = "django.db.models.BigAutoField"
