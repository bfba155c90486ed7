from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "apps.worker"
    label = "worker"
    verbose_name = "Runs"
