from django.apps import AppConfig


class InsightConfig(AppConfig):
    name = "apps.insight"
    label = "insight"
    verbose_name = "Insight"
