"""`manage.py check` for the receiver: forge settings a web process could not serve with."""

from django.core.checks import Error, register

from .forge_config import ForgeConfigError, forge_settings


@register("pidispatch")
def check_forge_config(app_configs, **kwargs):
    # Settings only: `manage.py` commands (workers included) must not need the forges' APIs to start.
    try:
        forge_settings()
    except ForgeConfigError as exc:
        return [Error(str(exc), id="pidispatch.E001")]
    return []
