"""The insight app: the cost page and /metrics."""

from django.apps import AppConfig


class InsightConfig(AppConfig):
    name = "apps.insight"
    label = "insight"
    verbose_name = "Insight"

    def ready(self):
        from django.db.models.signals import post_delete, post_save

        from apps.worker.housekeeping import runs_pruning
        from apps.worker.models import Run

        from .costs import forget_day, keep_pruned

        # A run record written or deleted (in whichever process: a worker, the admin, a command) drops the cost
        # page's kept partial of its day.
        def forget(sender, instance, **kwargs):
            forget_day(instance.started_at)

        post_save.connect(forget, sender=Run, dispatch_uid="insight-forget-day-saved", weak=False)
        post_delete.connect(forget, sender=Run, dispatch_uid="insight-forget-day-deleted", weak=False)
        # Housekeeping's batches (no per-row signal): /metrics keeps counting them, the cost page drops their days.
        runs_pruning.connect(keep_pruned, sender=Run, dispatch_uid="insight-keep-pruned", weak=False)
