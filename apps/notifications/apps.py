"""The notifications app: endpoints, deliveries and their attempts (apps/notifications/services.py sends them)."""

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "apps.notifications"
    label = "notifications"
    verbose_name = "Notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from apps.worker.gates.budget import soft_hold_reached
        from apps.worker.models import Run
        from apps.worker.records import run_recorded

        from . import services

        # The failure hook's events (apps/worker/failure_hook.py) and a budget window reaching its soft hold.
        run_recorded.connect(services.on_run_recorded, sender=Run, dispatch_uid="notifications-failures")
        soft_hold_reached.connect(services.on_soft_hold, dispatch_uid="notifications-soft-hold")
