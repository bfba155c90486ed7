"""The receiver app: webhook intake, triggers and the delivery inbox."""

from django.apps import AppConfig


class ReceiverConfig(AppConfig):
    name = "apps.receiver"
    label = "receiver"
    verbose_name = "Intake"

    def ready(self):
        from apps.worker.models import Run
        from apps.worker.records import run_recorded

        from . import checks  # noqa: F401  (registers the forge configuration check)
        from .triggers import on_run_recorded

        # A spent one-shot close rule disarms once its job's run record exists (failed runs included).
        run_recorded.connect(on_run_recorded, sender=Run, dispatch_uid="receiver-disarm-spent-one-shots")
