from datetime import timedelta

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.utils import timezone
from django.utils.functional import cached_property
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from pidispatch_site.admin_mixins import ManagedChangesAdmin, ReadOnlyAdminMixin

from . import run_logs, runtime_settings
from .publishing import kept
from .jobs import KINDS
from .models import DispatchSettings, PauseWindow, Run, ScopedLimit


class RecentValuesFilter(admin.SimpleListFilter):
    """Offers the values a field took in the last RECENT_DAYS of runs.

    Django's default field filter lists the distinct values of the whole table on every page view: a full
    scan per filter over a long history. The recent window is an index range (run_started_idx).
    """

    field = ""
    RECENT_DAYS = 30

    def lookups(self, request, model_admin):
        since = timezone.now() - timedelta(days=self.RECENT_DAYS)
        values = (Run.objects.filter(started_at__gte=since).exclude(**{self.field: ""})
                  .order_by(self.field).values_list(self.field, flat=True).distinct())
        return [(value, value) for value in values]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


def recent_values_filter(field: str, title: str) -> type[RecentValuesFilter]:
    return type(f"Recent{field.title().replace('_', '')}Filter", (RecentValuesFilter,),
                {"field": field, "title": title, "parameter_name": field})


class KindFilter(admin.SimpleListFilter):
    title = parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [(kind, kind) for kind in KINDS]

    def queryset(self, request, queryset):
        return queryset.filter(kind=self.value()) if self.value() else queryset


class EstimatedCountPaginator(Paginator):
    """On PostgreSQL an unfiltered run history is counted from the planner's estimate: an exact COUNT(*)
    over millions of rows on every page view buys a page count nobody needs to the unit."""

    @cached_property
    def count(self):
        query = getattr(self.object_list, "query", None)
        if connection.vendor == "postgresql" and query is not None and not query.where:
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                               [Run._meta.db_table])
                estimate = cursor.fetchone()[0]
            if estimate > 100_000:  # below that an exact count is cheap
                return estimate
        return super().count


@admin.register(Run)
class RunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Run history: read-only, because a run record is append-only evidence."""

    list_display = (
        "job_id", "target", "flow_or_command", "outcome", "reason", "published", "host",
        "duration_display", "tokens_total", "cost", "started_at",
    )
    actions = ["publish_again"]
    list_filter = (
        "outcome", recent_values_filter("reason", "reason"), KindFilter, recent_values_filter("host", "host"),
        recent_values_filter("trigger_type", "trigger type"), "started_at",
    )
    search_fields = ("job_id", "target", "delivery_id", "scope")
    paginator = EstimatedCountPaginator
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
        ("Published", {"fields": ("publish_outcome", "pull_request", "pushed_commits", "publish_url")}),
        # Dollar caps and run logs (apps/worker/budget.py, apps/worker/run_logs.py).
        ("Dollars", {"fields": ("dollar_basis", "dollars_reserved", "dollars_charged")}),
        ("Log", {"fields": ("summary_chars", "view_log")}),
    )

    @admin.display(description="log")
    def view_log(self, run: Run) -> str:
        return run_logs.admin_link(run)

    def get_fieldsets(self, request, obj=None):
        return run_logs.admin_fieldsets(super().get_fieldsets(request, obj), request.user)

    @admin.display(description="published", ordering="publish_outcome")
    def published(self, run: Run) -> str:
        if run.publish_url:
            return format_html('<a href="{}">{} #{}</a>', run.publish_url, run.publish_outcome, run.pull_request)
        return run.publish_outcome

    @admin.action(description="Publish again (work kept on this host after a failed publish)",
                  permissions=["publish_again"])
    def publish_again(self, request, queryset):
        for run in queryset:
            try:
                publication = kept.publish_again(run)
            except kept.NothingKept:
                self.message_user(request, f"{run.job_id}: no kept work on this host (published since, expired, "
                                           f"or kept on {run.host}: run `python manage.py publish_again "
                                           f"{run.job_id}` there).", messages.WARNING)
                continue
            level = messages.SUCCESS if publication.outcome in ("published", "commented") else messages.ERROR
            self.message_user(request, f"{run.job_id}: {publication.outcome}", level)

    def has_publish_again_permission(self, request):
        return request.user.has_perm("worker.publish_run")

    @admin.display(description="flow / command", ordering="flow")
    def flow_or_command(self, run: Run) -> str:
        return run.flow or (f"cmd:{run.command}" if run.command else "")

    @admin.display(description="duration", ordering="ended_at")
    def duration_display(self, run: Run) -> str:
        seconds = run.duration.total_seconds()
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields] + ["duration_display", "view_log"]


@admin.register(PauseWindow)
class PauseWindowAdmin(admin.ModelAdmin):
    list_display = ("scope", "hours", "tz", "days_display", "dates", "enabled", "note")
    list_editable = ("enabled",)
    list_filter = ("enabled", "tz")
    search_fields = ("scope", "note")
    fieldsets = (
        (None, {"fields": ("scope", "enabled", "note")}),
        ("When", {"fields": ("starts", "ends", "tz", "days", "date_from", "date_to"),
                  "description": "Jobs in scope that would start inside [from, to) wait until the window ends."}),
    )

    @admin.display(description="hours")
    def hours(self, window: PauseWindow) -> str:
        overnight = " (overnight)" if window.ends < window.starts else ""
        return f"{window.starts:%H:%M}-{window.ends:%H:%M}{overnight}"

    @admin.display(description="days")
    def days_display(self, window: PauseWindow) -> str:
        return ", ".join(window.days) or "every day"

    @admin.display(description="dates")
    def dates(self, window: PauseWindow) -> str:
        if not (window.date_from or window.date_to):
            return "-"
        return f"{window.date_from or '…'} to {window.date_to or '…'}"


@admin.register(ScopedLimit)
class ScopedLimitAdmin(ManagedChangesAdmin, admin.ModelAdmin):
    manage_permission = "worker.manage_limits"
    list_display = ("scope", "day", "week", "month", "concurrent", "note")
    search_fields = ("scope", "note")


@admin.register(DispatchSettings)
class DispatchSettingsAdmin(ManagedChangesAdmin, admin.ModelAdmin):
    """The one settings row. Blank fields fall back to the environment; the page shows what applies now."""

    manage_permission = "worker.manage_settings"
    readonly_fields = ("effective_values",)
    fieldsets = (
        ("In effect now", {"fields": ("effective_values",)}),
        ("Job-count caps (UTC day, Monday week, calendar month)",
         {"fields": ("daily_cap", "weekly_cap", "monthly_cap", "soft_hold_pct")}),
        ("Per run", {"fields": ("max_turns", "max_tokens", "job_memory", "job_cpus")}),
        ("Tokens", {"fields": ("daily_token_cap",)}),
        ("Per worker host", {"fields": ("concurrency",)}),
        ("Dollar caps (a window needs the per-run cap)",
         {"fields": ("max_cost_usd", "daily_cost_usd", "weekly_cost_usd", "monthly_cost_usd")}),
    )

    @admin.display(description="values jobs run under")
    def effective_values(self, row: DispatchSettings) -> str:
        try:
            effective = runtime_settings.current()
        except runtime_settings.SettingsInvalid as exc:
            return format_html("<strong>Invalid: every job is refused ({}).</strong>", exc)
        return format_html_join(
            mark_safe("<br>"), "{}: {}",
            ((name.replace("_", " "), "no cap" if value is None else value)
             for name, value in vars(effective).items()),
        )

    def has_add_permission(self, request):
        return super().has_add_permission(request) and not DispatchSettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        # One row: the list would only be a detour to it. A GET creates nothing: before the row is first
        # saved (from the add form) jobs run under the environment's values, and a viewer sees an empty list.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        row = DispatchSettings.objects.filter(pk=1).first()
        if row is not None:
            return redirect(reverse("admin:worker_dispatchsettings_change", args=[row.pk]))
        if self.has_add_permission(request):
            return redirect(reverse("admin:worker_dispatchsettings_add"))
        return super().changelist_view(request, extra_context)
