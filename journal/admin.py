from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import models, transaction

from . import services
from .models import Agent, ChainEntry, RecorderKey, Run, Step, Team, ToolServer


class ToolServerForm(forms.ModelForm):
    """A stdio server's command is picked from RECORDER_STDIO_COMMANDS, never typed: whatever it says runs as
    the Recorder's user, at every catalogue read. A command set from a shell (`add_tool_server --command`)
    can be kept or cleared here, not changed."""

    class Meta:
        model = ToolServer
        # the admin adds the rest it shows
        fields = ["name", "alias", "transport", "url", "command", "enabled"]

        @staticmethod
        def formfield_callback(field, **kwargs):  # as the admin's formfield_overrides below: https assumed
            return field.formfield(assume_scheme="https", **kwargs) if isinstance(field, models.URLField) \
                else field.formfield(**kwargs)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        allowed = list(settings.RECORDER_STDIO_COMMANDS)
        current = self.instance.command if self.instance.pk else ""
        if current and current not in allowed:
            allowed.append(current)
        self.fields["command"] = forms.ChoiceField(
            required=False,
            choices=[("", "None: reached over streamable HTTP at its URL"), *((c, c) for c in allowed)],
            help_text="Only the commands in the RECORDER_STDIO_COMMANDS setting; any other is added from a "
                      "shell "
            "with manage.py add_tool_server --command.",
        )


@admin.register(ToolServer)
class ToolServerAdmin(admin.ModelAdmin):
    form = ToolServerForm
    list_display = [
        "name",
        "alias",
        "transport",
        "url",
        "command",
        "enabled",
        "catalogue_fetched_at",
        "catalogue_error",
    ]
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
    looked at, deactivated, let ask approvers (off for one an account with no role made on the consent page),
    and given the advice on a failed call in its content (for frameworks that drop
    `_meta`)."""

    list_display = ["name", "team", "on_behalf_of", "token_prefix", "is_active", "asks_approvers",
                    "advice_in_content", "created_at"]
    list_filter = ["team"]
    fields = ["name", "team", "on_behalf_of", "token_prefix", "is_active", "asks_approvers", "runs_by",
              "advice_in_content", "created_at"]
    readonly_fields = ["name", "on_behalf_of", "token_prefix", "created_at"]

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        obj.save()  # the admin's change form is one transaction: the agent and its runs move together
        if "team" in form.changed_data:
            moved = services.move_agent(agent=obj, team=obj.team)
            self.message_user(request, f"{obj.name} and its {moved} run(s) now belong to {obj.team}.")


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Teams own agents; their members see, plan and sign for those agents only (admins see every team's).
    Members listed here are kept in step with the identity provider's groups at each sign-in (OIDC_GROUPS)."""

    list_display = ["name", "title", "everyone", "created_at"]
    fields = ["name", "title", "everyone", "members"]
    filter_horizontal = ["members"]

    def has_delete_permission(self, request, obj=None):
        return obj is None or not (obj.agents.exists() or obj.runs.exists())


class RecordAdmin(admin.ModelAdmin):
    """The run record is append-only, and only the Recorder appends to it (`journal.services`): nobody adds,
    changes or deletes a run, a step or a chain entry by hand, superusers included (deleting a run would
    cascade to its chain). The admin shows them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(RecordAdmin):
    list_display = ["public_id", "agent", "team", "state", "started_at", "step_count", "head_seq",
                    "checkpointed_seq"]
    list_filter = ["state", "team", "agent"]


@admin.register(Step)
class StepAdmin(RecordAdmin):
    list_display = ["run", "number", "server_name", "tool", "status", "reversibility", "started_at"]
    list_filter = ["status", "reversibility"]
    list_select_related = ["run"]


@admin.register(ChainEntry)
class ChainEntryAdmin(RecordAdmin):
    list_display = ["run", "seq", "event", "ts"]
    list_filter = ["event"]
    list_select_related = ["run"]


@admin.register(RecorderKey)
class RecorderKeyAdmin(admin.ModelAdmin):
    list_display = ["key_id", "origin", "valid_from", "valid_until"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # old public keys verify old checkpoints: never dropped
