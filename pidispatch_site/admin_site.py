"""The admin site: pidispatch's name on it, its sections in the order an operator uses them, and a status
strip on the front page (apps/fleet/overview.py).

Installed as the default site (`PidispatchAdminConfig` in INSTALLED_APPS), so `admin.site` and every
`@admin.register` are this site.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.urls import NoReverseMatch, path, reverse

# Fleet, Runs, Intake, then the API's tokens and the user accounts; anything else after them.
SECTION_ORDER = ("fleet", "worker", "receiver", "access", "auth")


def optional_url(name: str, *args) -> str:
    """A page another app may add (the cost page of apps/insight): its URL, or "" while it does not exist."""
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return ""


class PidispatchAdminSite(admin.AdminSite):
    site_header = "pidispatch"
    site_title = "pidispatch"
    index_title = "Operator's home"
    site_url = "/admin/"  # "View site": there is no public site, the admin is it
    index_template = "admin/pidispatch_index.html"
    enable_nav_sidebar = False  # its 280 px are the run list's: the breadcrumbs and the home page lead everywhere

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        rank = {label: index for index, label in enumerate(SECTION_ORDER)}
        return sorted(apps, key=lambda app: (rank.get(app["app_label"], len(rank)), app["name"]))

    def get_urls(self):
        from apps.worker.start_run_view import start_run_view

        return [path("start-run/", self.admin_view(start_run_view), name="start_run"), *super().get_urls()]

    def index(self, request, extra_context=None):
        from apps.fleet.connection import get_redis
        from apps.fleet.overview import strip

        context = {
            "strip": strip(get_redis()),
            "fleet_url": optional_url("admin:fleet_fleetpanel_changelist"),
            "cost_url": optional_url("admin:insight_spend_changelist"),
            "start_run_url": reverse("admin:start_run") if request.user.has_perm("worker.start_run") else "",
            **(extra_context or {}),
        }
        return super().index(request, context)


class PidispatchAdminConfig(AdminConfig):
    default_site = "pidispatch_site.admin_site.PidispatchAdminSite"
