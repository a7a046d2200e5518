from django.contrib import admin

from . import services
from .models import Approval, ApprovalRules, Passkey, Plan


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
