"""The REST API's routes (/api/v1/), its OpenAPI schema and its docs page (served from here: no CDN).

The views live beside what they show (apps/<app>/api.py); authentication, scopes and throttling are
apps/access/. Every state change a view makes goes through the one service the admin and the commands call.
"""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from apps.fleet import api as fleet
from apps.receiver import api as receiver
from apps.worker import api as worker

router = DefaultRouter(trailing_slash=False)
router.register("runs", worker.RunViewSet, basename="run")
router.register("limits", worker.ScopedLimitViewSet, basename="limit")
router.register("projects", worker.ProjectViewSet, basename="project")
router.register("pause-windows", worker.PauseWindowViewSet, basename="pause-window")
router.register("triggers", receiver.TriggerViewSet, basename="trigger")
router.register("deliveries", receiver.DeliveryViewSet, basename="delivery")

urlpatterns = [
    path("", include(router.urls)),
    path("settings", worker.SettingsView.as_view(), name="settings"),
    path("spend", worker.SpendView.as_view(), name="spend"),
    path("reasons", worker.ReasonsView.as_view(), name="reasons"),
    path("jobs/<str:job_id>", fleet.JobView.as_view(), name="job"),
    path("jobs/<str:job_id>/cancel", fleet.CancelView.as_view(), name="job-cancel"),
    path("fleet", fleet.FleetStatusView.as_view(), name="fleet"),
    path("fleet/hosts", fleet.HostsView.as_view(), name="fleet-hosts"),
    path("fleet/hosts/<str:name>/drain", fleet.DrainView.as_view(), name="host-drain"),
    path("fleet/hosts/<str:name>/undrain", fleet.UndrainView.as_view(), name="host-undrain"),
    path("fleet/queues", fleet.QueuesView.as_view(), name="fleet-queues"),
    path("fleet/queues/<str:name>/pause", fleet.PauseView.as_view(), name="queue-pause"),
    path("fleet/queues/<str:name>/resume", fleet.ResumeView.as_view(), name="queue-resume"),
    path("fleet/pause-all", fleet.PauseAllView.as_view(), name="pause-all"),
    path("fleet/resume-all", fleet.ResumeView.as_view(every_queue=True), name="resume-all"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
]
