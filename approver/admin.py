from django.contrib import admin

from .models import Plan


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
