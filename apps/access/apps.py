"""The access app: API tokens, their scopes and the per-token throttle."""

from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "apps.access"
    label = "access"
    verbose_name = "API access"
