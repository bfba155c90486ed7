from django.core.checks import Error, register

from .forge_config import ForgeConfigError, forge_config


@register("pidispatch")
def check_forge_config(app_configs, **kwargs):
    try:
        forge_config()
    except ForgeConfigError as exc:
        return [Error(str(exc), id="pidispatch.E001")]
    return []
