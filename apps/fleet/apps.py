"""The fleet app: queues, hosts, pauses, cancel and the admin's fleet panel."""

from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "apps.fleet"
    label = "fleet"
    verbose_name = "Fleet"
