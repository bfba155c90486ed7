from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from apps.insight import views as insight_views
from apps.receiver import views as receiver_views

from .health import healthz

# The public edge (PI_PUBLIC_EDGE) serves exactly these: the webhook intake and the health check.
urlpatterns = [
    re_path(r"^hooks/github/?$", receiver_views.github_hook, name="hook-github"),
    re_path(r"^hooks/gitlab/?$", receiver_views.gitlab_hook, name="hook-gitlab"),
    re_path(r"^hooks/forgejo/?$", receiver_views.forgejo_hook, name="hook-forgejo"),
    re_path(r"^hooks/azure/?$", receiver_views.azure_hook, name="hook-azure"),
    re_path(r"^hooks/(?P<name>[^/]*)/?$", receiver_views.unknown_hook, name="hook-unknown"),
    path("healthz", healthz, name="healthz"),
]

if not settings.PI_PUBLIC_EDGE:
    urlpatterns += [
        # The fleet panel is the fleet app's page in the admin.
        path("admin/fleet/", RedirectView.as_view(pattern_name="admin:fleet_fleetpanel_changelist"), name="fleet-panel"),
        path("admin/", admin.site.urls),
        path("api/v1/", include(("pidispatch_site.api", "api"), namespace="api")),
        # Prometheus scrapes the private instance; the run history's numbers never reach the public edge.
        path("metrics", insight_views.metrics, name="metrics"),
    ]
