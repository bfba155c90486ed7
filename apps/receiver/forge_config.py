"""Which forges this deployment serves, read once from settings and checked before serving.

A forge is configured as soon as its webhook secret, mode or self id is set; a configured forge must then
be complete. An incomplete one refuses to start (wsgi/asgi call `forge_config()` at import, `manage.py
check` reports it): a receiver never serves a forge it cannot verify, or whose own identity (the bot-loop
guard) it cannot know.

The self identity comes from `<FORGE>_SELF_ID`, or else from the forge API with the forge's token
(`GET /user` and friends) at start. A token the forge refuses stops the start; a forge that is merely
unreachable at start does not: its deliveries wait in the inbox (pending) until the identity is known.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from apps import forge_registry
from apps.worker.forges import Identity, IdentityUnavailable, forge_client

logger = logging.getLogger("pidispatch.receiver")

FORGES = forge_registry.NAMES
GITLAB_MODES = ("token", "signature")
AZURE_MODES = ("basic", "header")
IDENTITY_RETRY_SECONDS = 30


class ForgeConfigError(ImproperlyConfigured):
    pass


@dataclass(frozen=True)
class GitHubConfig:
    webhook_secret: bytes
    self_id: str  # "" = resolved through the API


@dataclass(frozen=True)
class GitLabConfig:
    mode: str
    token_secret: bytes  # token mode: the shared token
    signing_key: bytes  # signature mode: the decoded `whsec_` key
    self_id: str


@dataclass(frozen=True)
class ForgejoConfig:
    webhook_secret: bytes
    self_id: str


@dataclass(frozen=True)
class AzureConfig:
    mode: str
    credential: bytes  # basic: base64 of `user:password`; header: the header's value
    header: str  # header mode: the header's name
    self_id: str
    self_email: str


class ForgeConfig:
    """Each forge's configuration by name (None: not served), read as `config.of("gitlab")` or `config.gitlab`."""

    def __init__(self, configs: dict):
        self._configs = dict(configs)

    def of(self, forge: str):
        return self._configs.get(forge)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._configs:
            raise AttributeError(name)
        return self._configs[name]

    def served(self) -> list[str]:
        return [forge for forge in forge_registry.NAMES if self._configs.get(forge) is not None]


def _setting(name: str) -> str:
    return str(getattr(settings, name, "") or "").strip()


def _require(forge_name: str, name: str, why: str) -> str:
    value = _setting(name)
    if not value:
        raise ForgeConfigError(f"{name} is required when {forge_name} is configured: {why}")
    return value


def _self_id(forge_name: str, prefix: str, *, numeric: bool, token_setting: str, alternative: str = "") -> str:
    """The configured self id, or "" when the API can tell it (a token, or GitHub's App, is configured)."""
    value = _setting(f"{prefix}_SELF_ID")
    if value:
        if numeric and not value.isdigit():
            raise ForgeConfigError(
                f"{prefix}_SELF_ID must be the numeric {forge_name} user id of this deployment's own account "
                "(the bot-loop guard ignores events it caused itself)."
            )
        return value
    if not _setting(token_setting) and not (alternative and _setting(alternative)):
        raise ForgeConfigError(
            f"{prefix}_SELF_ID is required when {forge_name} is configured and {token_setting} is unset: the "
            "bot-loop guard must know this deployment's own account. Set it to that account's id, or set "
            f"{token_setting} so it is looked up at start."
        )
    return ""


def github_config() -> GitHubConfig | None:
    if not (_setting("GITHUB_WEBHOOK_SECRET") or _setting("GITHUB_SELF_ID")):
        return None
    secret = _require("GitHub", "GITHUB_WEBHOOK_SECRET",
                      "refusing to serve GitHub webhooks that cannot be verified. "
                      "Set it to the secret of the GitHub webhook.")
    self_id = _self_id("GitHub", "GITHUB", numeric=True, token_setting="GITHUB_TOKEN", alternative="GITHUB_APP_ID")
    return GitHubConfig(webhook_secret=secret.encode(), self_id=self_id)


def _gitlab_signing_key(secret: str) -> bytes:
    encoded = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        raise ForgeConfigError(
            "GITLAB_WEBHOOK_SECRET must be the webhook's signing token (`whsec_` followed by base64) when "
            "GITLAB_WEBHOOK_MODE=signature; copy it from the webhook's settings in GitLab."
        )
    return key


def gitlab_config() -> GitLabConfig | None:
    if not (_setting("GITLAB_WEBHOOK_MODE") or _setting("GITLAB_WEBHOOK_SECRET") or _setting("GITLAB_SELF_ID")):
        return None
    mode = _setting("GITLAB_WEBHOOK_MODE")
    if mode not in GITLAB_MODES:
        raise ForgeConfigError(
            "GITLAB_WEBHOOK_MODE must be `token` (the webhook's secret token, X-Gitlab-Token) or `signature` "
            "(the webhook's signing token, GitLab 19+): a receiver checks exactly the declared mechanism."
        )
    secret = _require("GitLab", "GITLAB_WEBHOOK_SECRET", "refusing to serve GitLab webhooks that cannot be verified.")
    _require("GitLab", "GITLAB_TOKEN",
             "each actor's access level is looked up through the API (a project or group access token with "
             "read_api).")
    self_id = _self_id("GitLab", "GITLAB", numeric=True, token_setting="GITLAB_TOKEN")
    if mode == "signature":
        return GitLabConfig(mode=mode, token_secret=b"", signing_key=_gitlab_signing_key(secret), self_id=self_id)
    return GitLabConfig(mode=mode, token_secret=secret.encode(), signing_key=b"", self_id=self_id)


def forgejo_config() -> ForgejoConfig | None:
    if not (_setting("FORGEJO_WEBHOOK_SECRET") or _setting("FORGEJO_SELF_ID")):
        return None
    secret = _require("Forgejo", "FORGEJO_WEBHOOK_SECRET",
                      "refusing to serve Forgejo/Gitea webhooks that cannot be verified.")
    _require("Forgejo", "FORGEJO_URL",
             "the instance root, e.g. https://codeberg.org (permissions are looked up there).")
    _require("Forgejo", "FORGEJO_TOKEN", "each actor's repository permission is looked up through the API.")
    self_id = _self_id("Forgejo", "FORGEJO", numeric=True, token_setting="FORGEJO_TOKEN")
    return ForgejoConfig(webhook_secret=secret.encode(), self_id=self_id)


def azure_config() -> AzureConfig | None:
    if not (_setting("AZURE_WEBHOOK_MODE") or _setting("AZURE_WEBHOOK_SECRET") or _setting("AZURE_SELF_ID")):
        return None
    mode = _setting("AZURE_WEBHOOK_MODE")
    if mode not in AZURE_MODES:
        raise ForgeConfigError(
            "AZURE_WEBHOOK_MODE must be `basic` (the service hook's basic authentication) or `header` (a custom "
            "header named by AZURE_WEBHOOK_HEADER): Azure DevOps signs nothing, so the receiver checks exactly "
            "the declared credential."
        )
    secret = _require("Azure DevOps", "AZURE_WEBHOOK_SECRET",
                      "refusing to serve Azure DevOps service hooks that cannot be authenticated.")
    header = ""
    if mode == "header":
        header = _require("Azure DevOps", "AZURE_WEBHOOK_HEADER", "header mode compares the value of this header.")
    _require("Azure DevOps", "AZURE_ORG_URL", "the organisation URL, e.g. https://dev.azure.com/fabrikam.")
    _require("Azure DevOps", "AZURE_TOKEN", "project membership is looked up through the Graph API (vso.graph).")
    self_id = _self_id("Azure DevOps", "AZURE", numeric=False, token_setting="AZURE_TOKEN").lower()
    credential = secret
    if mode == "basic" and ":" in secret:
        # `user:password` as typed into the subscription; Azure sends its base64.
        credential = base64.b64encode(secret.encode()).decode()
    return AzureConfig(mode=mode, credential=credential.encode(), header=header, self_id=self_id,
                       self_email=_setting("AZURE_SELF_EMAIL").lower())


@lru_cache(maxsize=1)
def forge_settings() -> ForgeConfig:
    """The served forges from settings alone (no network). Raises ForgeConfigError when incomplete."""
    return ForgeConfig({name: forge_registry.config(name) for name in forge_registry.NAMES})


# --- self identity --------------------------------------------------------------------------------------

_identities: dict[str, Identity] = {}
_last_failure: dict[str, float] = {}
_identity_lock = threading.Lock()


def _configured_identity(forge: str) -> Identity | None:
    config = forge_settings().of(forge)
    if config is None or not config.self_id:
        return None
    return Identity(id=config.self_id, email=getattr(config, "self_email", ""))


def _resolve(forge: str) -> Identity:
    identity = forge_client(forge).self_identity()
    if forge == "azure" and _setting("AZURE_SELF_EMAIL"):
        identity = Identity(id=identity.id, email=_setting("AZURE_SELF_EMAIL").lower())
    logger.info("self_identity forge=%s id=%s source=api", forge, identity.id)
    return identity


def identity_at_hand(forge: str) -> bool:
    """True when self_identity() answers without asking the forge (configured, or learned already)."""
    return _configured_identity(forge) is not None or forge in _identities


def self_identity(forge: str) -> Identity | None:
    """This deployment's own account on `forge`, or None while the forge cannot tell us (retried later)."""
    configured = _configured_identity(forge)
    if configured is not None:
        return configured
    with _identity_lock:
        if forge in _identities:
            return _identities[forge]
        if time.monotonic() - _last_failure.get(forge, -1e9) < IDENTITY_RETRY_SECONDS:
            return None
        try:
            _identities[forge] = _resolve(forge)
        except IdentityUnavailable as failure:
            _last_failure[forge] = time.monotonic()
            logger.error("self_identity_unavailable forge=%s reason=%s determinate=%s", forge, failure.reason,
                         str(failure.determinate).lower())
            return None
        return _identities[forge]


def _resolve_at_start(config: ForgeConfig) -> None:
    for forge in config.served():
        if _configured_identity(forge) is not None or forge in _identities:
            continue
        try:
            with _identity_lock:
                _identities[forge] = _resolve(forge)
        except IdentityUnavailable as failure:
            if failure.determinate:
                entry = forge_registry.get(forge)
                credential = ("the GitHub App (GITHUB_APP_ID)" if forge == "github" and _setting("GITHUB_APP_ID")
                              else entry.token_setting)
                raise ForgeConfigError(
                    f"cannot learn this deployment's own {forge} account: the API refused {credential} "
                    f"({failure.reason}). Fix the token, or set {entry.settings_prefix}SELF_ID to the account's id."
                ) from None
            _last_failure[forge] = time.monotonic()
            logger.warning("self_identity_deferred forge=%s reason=%s", forge, failure.reason)


def forge_config() -> ForgeConfig:
    """The start gate: settings complete, and every self identity known or at least knowable."""
    config = forge_settings()
    _resolve_at_start(config)
    return config


def forget_identities() -> None:
    with _identity_lock:
        _identities.clear()
        _last_failure.clear()


@receiver(setting_changed)
def _forget_forge_config(setting, **kwargs):
    if setting.startswith(tuple(forge.settings_prefix for forge in forge_registry.FORGES)):
        forge_settings.cache_clear()
        forget_identities()
