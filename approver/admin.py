from django import forms
from django.conf import settings
from django.contrib import admin, messages

from . import services
from .models import (
    WEBHOOK_EVENTS,
    Approval,
    ApprovalRules,
    Passkey,
    Plan,
    WebhookDelivery,
    WebhookEndpoint,
)
from .services import webhooks


class ReadOnly(admin.ModelAdmin):
    """Plans change only through `approver.services` (the pages, the commands, the worker): one writer per
    transition. The admin shows them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Plan)
class PlanAdmin(ReadOnly):
    list_display = ["public_id", "run", "state", "requested_by", "created_at", "compensate_count",
                    "cannot_undo_count", "conflict_count", "checks_done", "checks_total"]
    list_filter = ["state"]
    list_select_related = ["run", "requested_by"]


@admin.register(ApprovalRules)
class ApprovalRulesAdmin(admin.ModelAdmin):
    """The approval rules: who may approve, how many must, how long an approval lasts; one row for every team
    without its own (team blank), and one per team that has its own."""

    list_display = ["team", "approver_role", "quorum", "valid_for", "separation_of_duties"]

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        # The one writer of the row, which logs who changed what with the policies' changes.
        services.save_approval_rules(rules=obj, by=request.user)


@admin.register(Approval)
class ApprovalAdmin(ReadOnly):
    list_display = ["plan", "approver", "decision", "created_at", "expires_at"]
    list_select_related = ["plan", "approver"]


@admin.register(Passkey)
class PasskeyAdmin(ReadOnly):
    list_display = ["user", "name", "created_at", "last_used_at", "revoked_at"]
    list_select_related = ["user"]


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https",
                         help_text="Where the events are POSTed (https in production).")
    events = forms.MultipleChoiceField(choices=list(WEBHOOK_EVENTS.items()), required=False,
                                       widget=forms.CheckboxSelectMultiple,
                                       help_text="The events it hears; none ticked: every one.")

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "description", "events", "team", "is_active"]

    def clean_url(self):
        url = self.cleaned_data["url"]
        if settings.PRODUCTION and not url.startswith("https://"):
            raise forms.ValidationError("In production, events go over https only: they name plans and "
                                        "people.")
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Where events are POSTed, each delivery signed with the endpoint's secret (made when it is saved)."""

    form = WebhookEndpointForm
    list_display = ["url", "description", "team", "is_active", "created_at"]
    readonly_fields = ["signing_secret"]
    actions = ["new_secret"]

    @admin.action(description="Make a new signing secret (the old one stops at once)")
    def new_secret(self, request, queryset):
        for endpoint in queryset:
            WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret=webhooks.new_secret())
        self.message_user(request, "New secrets made: give each receiver its endpoint's new one.",
                          messages.WARNING)

    @admin.display(description="Signing secret")
    def signing_secret(self, obj):
        return obj.secret or "Made when you save: the receiver checks every delivery's signature with it."

    def save_model(self, request, obj, form, change):
        if not obj.secret:
            obj.secret = webhooks.new_secret()
        super().save_model(request, obj, form, change)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly):
    """Every delivery with how it went; one that gave up may be sent again (same id)."""

    list_display = ["created_at", "event", "endpoint", "state", "attempts", "last_status", "next_attempt_at",
                    "delivered_at"]
    list_filter = ["state", "event", "endpoint"]
    list_select_related = ["endpoint"]
    actions = ["send_again"]

    @admin.action(description="Send again")
    def send_again(self, request, queryset):
        for delivery in queryset.exclude(state=WebhookDelivery.State.DELIVERED):
            webhooks.send_again(delivery=delivery)
        self.message_user(request, "Sent again, once the worker takes them.", messages.SUCCESS)
