"""The cost page (the fleet panel's pattern: a placeholder model, `get_urls`, `admin_view`). Read-only."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis
from apps.worker import spend as worker_spend
from pidispatch_site.admin_mixins import ReadOnlyAdminMixin

from . import chart, costs
from .models import Spend

VIEW = "worker.view_run"  # the page aggregates run records: whoever may read them may read what they cost


@admin.register(Spend)
class SpendAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    def get_urls(self):
        return [path("", self.admin_site.admin_view(self.cost_view), name="insight_spend_changelist")]

    def has_module_permission(self, request):
        return request.user.has_perm(VIEW)

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW)

    def cost_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(VIEW):
            raise PermissionDenied
        now = timezone.now()
        summary = costs.summary(request.GET.get("window", costs.DEFAULT_WINDOW), now)
        budget, budget_error = None, ""
        try:
            budget = worker_spend.budget_in_force(get_redis(), now)
        except (RedisError, DatabaseError) as exc:
            budget_error = f"the budget counters could not be read ({type(exc).__name__})"
        largest = {b.name: max((row.spend for row in b.rows), default=0) for b in summary.breakdowns}
        breakdowns = [{"name": b.name, "more": b.more, "more_spend": b.more_spend,
                       "rows": [{"row": row,
                                 "bar": chart.bar(row.spend, largest[b.name], estimated=bool(row.estimated))}
                                for row in b.rows]} for b in summary.breakdowns]
        budget_lines = [{"line": line, "meter": chart.meter(line.percent, line.state)}
                        for line in (budget.lines if budget else ())]
        context = {
            **self.admin_site.each_context(request),
            "title": "Costs",
            "opts": self.model._meta,
            "summary": summary,
            "totals": summary.totals,
            "windows": costs.WINDOWS,
            "daily_svg": chart.daily_spend(summary.days, summary.window.label),
            "breakdowns": breakdowns,
            "budget": budget,
            "budget_lines": budget_lines,
            "budget_error": budget_error,
            "generated_at": now,
            "all_runs_url": costs.run_list_url(summary.window),
        }
        return TemplateResponse(request, "admin/insight/cost_page.html", context)
