"""The worker app: jobs, the gate ladder, the sandbox, the worker process and run records."""

from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "apps.worker"
    label = "worker"
    verbose_name = "Runs"

    def ready(self):
        from apps.worker import failure_hook
        from apps.worker.forges.comments import on_run_recorded
        from apps.worker.gates import checks  # noqa: F401  registers the configuration checks
        from apps.worker.models import Run
        from apps.worker.records import run_recorded

        # Status comments on the issue or pull request: one home for every run record (apps/worker/forges/comments.py).
        run_recorded.connect(on_run_recorded, sender=Run, dispatch_uid="worker-status-comments")
        # The failure hook (PI_ON_FAILURE), once per job that failed for good or stopped after spending.
        run_recorded.connect(failure_hook.on_run_recorded, sender=Run, dispatch_uid="worker-failure-hook")
