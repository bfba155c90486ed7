from django.apps import AppConfig


class ReceiverConfig(AppConfig):
    name = "apps.receiver"
    label = "receiver"
    verbose_name = "Intake"

    def ready(self):
        from . import checks  # noqa: F401  (registers the forge configuration check)
