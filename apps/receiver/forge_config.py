"""Which forges this deployment serves, read once from settings and checked before serving.

A forge is configured as soon as any of its settings is set; a configured forge must then be complete.
An incomplete one refuses to start (wsgi/asgi call `forge_config()` at import, `manage.py check` reports
it): a receiver never serves a forge it cannot verify, or whose own identity (the bot-loop guard) it
does not know.
"""

from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver


class ForgeConfigError(ImproperlyConfigured):
    pass


@dataclass(frozen=True)
class GitHubConfig:
    webhook_secret: bytes
    self_id: str


@dataclass(frozen=True)
class ForgeConfig:
    github: GitHubConfig | None = None


def _github() -> GitHubConfig | None:
    secret = settings.GITHUB_WEBHOOK_SECRET or ""
    self_id = str(settings.GITHUB_SELF_ID or "").strip()
    if not secret and not self_id:
        return None
    if not secret.strip():
        raise ForgeConfigError(
            "GITHUB_WEBHOOK_SECRET is required when GitHub is configured: refusing to serve GitHub webhooks "
            "that cannot be verified. Set it to the secret of the GitHub webhook."
        )
    if not self_id.isdigit():
        raise ForgeConfigError(
            "GITHUB_SELF_ID must be the numeric GitHub user id of this deployment's own account (the bot-loop "
            "guard ignores events it caused itself). Find it with `curl https://api.github.com/users/<login>`."
        )
    return GitHubConfig(webhook_secret=secret.encode(), self_id=self_id)


@lru_cache(maxsize=1)
def forge_config() -> ForgeConfig:
    return ForgeConfig(github=_github())


@receiver(setting_changed)
def _forget_forge_config(setting, **kwargs):
    if setting.startswith(("GITHUB_", "GITLAB_", "FORGEJO_", "AZURE_")):
        forge_config.cache_clear()
