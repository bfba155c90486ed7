"""A job's model provider as the egress gateway serves it: where its calls really go, how they are
authorised, and which of this worker's environment variables holds the key.

The key never enters the container. pi inside it is pointed at the gateway (apps/worker/sandbox/agent_config.py)
and the gateway adds the key on the way out. Built-in providers (pi's own registry, pinned with pi in
pi_registry.json) need nothing but their key; any other endpoint is configured for the deployment's provider:

    PI_PROVIDER=acme PI_PROVIDER_BASE_URL=https://llm.acme.example/v1 PI_PROVIDER_API=openai-completions
    PI_PROVIDER_KEY_VARS=acme:ACME_LLM_KEY ACME_LLM_KEY=...

`PI_PROVIDER_BASE_URL` also serves a built-in provider behind a company proxy (its API kind stays pi's).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

REGISTRY_FILE = Path(__file__).resolve().parent / "pi_registry.json"
# The APIs whose usage the gateway can read from the provider's own responses (metering.py).
METERED_APIS = ("anthropic-messages", "openai-completions", "openai-responses", "google-generative-ai")
# Providers pi knows whose API the gateway cannot meter: named here so their key is still reserved.
UNMETERED_KEY_VARIABLES = {"mistral": "MISTRAL_API_KEY"}


@cache
def registry() -> dict:
    return json.loads(REGISTRY_FILE.read_text())


def builtin_providers() -> dict[str, dict]:
    return registry()["providers"]


def key_variable_overrides() -> dict[str, str]:
    """PI_PROVIDER_KEY_VARS as {provider: VAR}."""
    return dict(entry.split(":", 1) for entry in settings.PI_PROVIDER_KEY_VARS.split(",") if ":" in entry)


def known_key_variables() -> set[str]:
    """Every variable that may hold a provider key (a job's secrets may not take these names)."""
    return ({entry["keyVariable"] for entry in builtin_providers().values()}
            | set(UNMETERED_KEY_VARIABLES.values()) | set(key_variable_overrides().values()))


def key_variable(provider: str) -> str | None:
    builtin = builtin_providers().get(provider) or {}
    return (key_variable_overrides().get(provider) or builtin.get("keyVariable")
            or UNMETERED_KEY_VARIABLES.get(provider))


def credential(provider: str) -> tuple[str, str] | None:
    """(variable name, value) for the provider, or None when this worker has no usable key for it."""
    variable = key_variable(provider)
    value = os.environ.get(variable, "") if variable else ""
    return (variable, value) if value.strip() else None


@dataclass(frozen=True)
class Upstream:
    """Where a provider's calls go. `base_url` keeps its path (`https://api.openai.com/v1`): pi appends the
    API's own paths to it, and the gateway forwards only requests under that path."""

    provider: str
    api: str
    base_url: str
    builtin: bool

    @property
    def origin(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def path(self) -> str:
        return urlsplit(self.base_url).path.rstrip("/")

    @property
    def hostname(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    @property
    def host_port(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def upstream(provider: str) -> Upstream | None:
    """The provider's upstream, or None when the gateway cannot serve it (unknown, or an API it cannot meter)."""
    builtin = builtin_providers().get(provider)
    if provider == settings.PI_PROVIDER and settings.PI_PROVIDER_BASE_URL:
        api = settings.PI_PROVIDER_API or (builtin or {}).get("api", "")
        if api not in METERED_APIS:
            return None
        return Upstream(provider, api, settings.PI_PROVIDER_BASE_URL.rstrip("/"), builtin is not None)
    if builtin is None:
        return None
    return Upstream(provider, builtin["api"], builtin["baseUrl"], True)
