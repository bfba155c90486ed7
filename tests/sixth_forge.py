"""A sixth forge, whole, in one module: its registry entry, its hook (verify and normalise), its configuration, its
client, and the settings module that registers it before the apps load (`DJANGO_SETTINGS_MODULE=tests.sixth_forge`).
tests/site/test_sixth_forge.py starts processes with it and looks for it where an operator and a forge would.

It speaks GitHub's webhook dialect (signature and payload), so only what the registry says differs: its name, label,
job prefix, settings, web pages and client. Its client answers the matcher's authority question itself."""

from dataclasses import dataclass, replace

from apps import forge_registry
from apps.worker.forges.base import Authority, ForgeClient, Identity
from pidispatch_site.settings import *  # noqa: F403 (a settings module: the deployment's, plus the sixth forge)

SIXTH = forge_registry.Forge(
    "sixth", "Sixth Forge", "sx", "tests.sixth_forge", "tests.sixth_forge.SixthClient", ("labeled", "opened"),
    "tests.sixth_forge.sixth_config", "SIXTH_WEBHOOK_SECRET", "SIXTH_TOKEN", "SIXTH_API_URL", "SIXTH_WEB_URL",
    issue_page="{repo}/tickets/{number}", pull_page="{repo}/changes/{number}", pr_label_action="labeled")
if "sixth" not in forge_registry.BY_NAME:
    forge_registry.register(SIXTH)

SIXTH_WEBHOOK_SECRET = "sixth-webhook-secret"
SIXTH_TOKEN = "sixth-token"
SIXTH_API_URL = "https://api.sixth.example"
SIXTH_WEB_URL = "https://sixth.example/web"
SIXTH_SELF_ID = "1"


# --- the receiver's side: its configuration and its hook -----------------------------------------------------------

@dataclass(frozen=True)
class SixthConfig:
    webhook_secret: bytes
    self_id: str


def sixth_config():
    from django.conf import settings

    if not settings.SIXTH_WEBHOOK_SECRET:
        return None
    return SixthConfig(webhook_secret=settings.SIXTH_WEBHOOK_SECRET.encode(), self_id=settings.SIXTH_SELF_ID)


def verify(request, config):
    from apps.receiver.hooks import github

    return github.verify(request, config)


def normalise(event: str, delivery_id: str, payload: dict):
    from apps.receiver.hooks import github

    return replace(github.normalise(event, delivery_id, payload), forge="sixth")


# --- the worker's side: its client -----------------------------------------------------------------------------------

class SixthClient(ForgeClient):
    forge = "sixth"
    identity_path = "/whoami"
    token_variables = ("SIXTH_TOKEN",)
    url_variable = "SIXTH_API_URL"

    @classmethod
    def from_settings(cls, **common):
        from django.conf import settings

        return cls(base_url=settings.SIXTH_API_URL, token=settings.SIXTH_TOKEN, **common)

    def _lookup_authority(self, subject):
        return Authority.yes("sixth-writer")

    def _lookup_identity(self):
        return Identity(id=SIXTH_SELF_ID)
