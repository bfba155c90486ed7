"""The site's routes: the public edge's webhooks and health check, then the private instance's admin, API and
metrics."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from apps.insight import views as insight_views
from apps.receiver import views as receiver_views
from apps.worker import run_logs

from .health import healthz

handler404 = "pidispatch_site.api_errors.page_not_found"

# The public edge (PI_PUBLIC_EDGE) serves exactly these: the webhook intake and the health check.
urlpatterns = [
    *(re_path(rf"^hooks/{name}/?$", view, name=f"hook-{name}") for name, view in receiver_views.HOOK_VIEWS.items()),
    re_path(r"^hooks/(?P<name>[^/]*)/?$", receiver_views.unknown_hook, name="hook-unknown"),
    path("healthz", healthz, name="healthz"),
]

if not settings.PI_PUBLIC_EDGE:
    urlpatterns += [
        # The private server's root is the operator's home (the public edge has none: 404).
        path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),
        # The fleet panel is the fleet app's page in the admin.
        path("admin/fleet/", RedirectView.as_view(pattern_name="admin:fleet_fleetpanel_changelist"),
             name="fleet-panel"),
        *run_logs.urlpatterns,  # a run's `View log` (worker.view_run_log), before the admin's own pages
        path("admin/", admin.site.urls),
        path("api/v1/", include(("pidispatch_site.api", "api"), namespace="api")),
        # Prometheus scrapes the private instance; the run history's numbers never reach the public edge.
        path("metrics", insight_views.metrics, name="metrics"),
    ]
