from django.contrib import admin

from .models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Run history: read-only, because a run record is append-only evidence."""

    list_display = (
        "job_id", "target", "flow_or_command", "outcome", "reason", "host",
        "duration_display", "tokens_total", "cost", "started_at",
    )
    list_filter = ("outcome", "reason", "kind", "host", "trigger_type", "started_at")
    search_fields = ("job_id", "target", "delivery_id", "scope")
    date_hierarchy = "started_at"
    list_select_related = ("trigger",)
    list_per_page = 50
    show_full_result_count = False  # a count(*) over a long history on every page view is wasted work
    fieldsets = (
        (None, {"fields": ("job_id", "attempt", "outcome", "reason", "exit_code")}),
        ("What ran", {"fields": ("kind", "target", "scope", "flow", "command", "image",
                                 "replica", "replicas", "parent_job_id")}),
        ("Where and when", {"fields": ("host", "queue", "started_at", "ended_at", "duration_display")}),
        ("Why", {"fields": ("trigger", "trigger_type", "delivery_id")}),
        ("Spend", {"fields": ("turns", "tokens_in", "tokens_out", "tokens_total", "cost", "usage",
                              "budget_reserved")}),
    )

    @admin.display(description="flow / command", ordering="flow")
    def flow_or_command(self, run: Run) -> str:
        return run.flow or (f"cmd:{run.command}" if run.command else "")

    @admin.display(description="duration", ordering="ended_at")
    def duration_display(self, run: Run) -> str:
        seconds = run.duration.total_seconds()
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields] + ["duration_display"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
