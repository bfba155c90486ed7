"""The admin site: pidispatch's name on it, its sections in the order an operator uses them, and a status
strip on the front page (apps/fleet/overview.py).

Installed as the default site (`PidispatchAdminConfig` in INSTALLED_APPS), so `admin.site` and every
`@admin.register` are this site.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.urls import path, reverse

# Fleet, Runs, Intake, then the API's tokens and the user accounts; anything else after them.
SECTION_ORDER = ("fleet", "worker", "receiver", "access", "auth")


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
            # Linked for those who may open them (the fleet panel's and the cost page's own permissions).
            "fleet_url": (reverse("admin:fleet_fleetpanel_changelist") if request.user.has_perm("fleet.view_fleet")
                          else ""),
            "cost_url": reverse("admin:insight_spend_changelist") if request.user.has_perm("worker.view_run") else "",
            "start_run_url": reverse("admin:start_run") if request.user.has_perm("worker.start_run") else "",
            **(extra_context or {}),
        }
        return super().index(request, context)


class PidispatchAdminConfig(AdminConfig):
    default_site = "pidispatch_site.admin_site.PidispatchAdminSite"
