from django.contrib import admin, messages
from django.db import models, transaction

from . import services
from .models import Agent, RecorderKey, Run, ToolServer


@admin.register(ToolServer)
class ToolServerAdmin(admin.ModelAdmin):
    list_display = ["name", "transport", "url", "command", "enabled", "catalogue_fetched_at", "catalogue_error"]
    readonly_fields = ["catalogue", "catalogue_fetched_at", "catalogue_error", "receipt_keys", "created_at"]
    actions = ["refresh_catalogues"]
    # Django 6's default, adopted now: a URL typed without a scheme is taken as https.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def save_model(self, request, obj, form, change):
        services.save_tool_server(server=obj)  # the one writer of the row, as for the command
        # The admin saves inside a transaction; reading the catalogue is network I/O, so it waits for the
        # commit rather than holding the transaction open while a tool server answers.
        transaction.on_commit(lambda: self._refresh(request, obj))

    @admin.action(description="Read the selected servers' catalogues again")
    def refresh_catalogues(self, request, queryset):
        for server in queryset:
            self._refresh(request, server)

    def _refresh(self, request, server):
        server = services.refresh_catalogue(server=server)
        if server.catalogue_error:
            self.message_user(request, f"{server.name}: {server.catalogue_error}", messages.WARNING)
        else:
            self.message_user(request, f"{server.name}: {len(server.catalogue)} tools read.")


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """Agents are created with `manage.py create_agent`, which shows the token once; here they can be
    looked at and deactivated."""

    list_display = ["name", "on_behalf_of", "token_prefix", "is_active", "created_at"]
    fields = ["name", "on_behalf_of", "token_prefix", "is_active", "created_at"]
    readonly_fields = ["name", "on_behalf_of", "token_prefix", "created_at"]

    def has_add_permission(self, request):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["public_id", "agent", "state", "started_at", "step_count", "head_seq", "checkpointed_seq"]
    list_filter = ["state", "agent"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # the record is append-only; nobody edits it by hand


@admin.register(RecorderKey)
class RecorderKeyAdmin(admin.ModelAdmin):
    list_display = ["key_id", "origin", "valid_from", "valid_until"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # old public keys verify old checkpoints: never dropped
