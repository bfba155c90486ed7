"""Secrets (`run.secrets`): resolve a job's references into values on this host, just before spend.

A job carries `{ENV_NAME: reference}` and maybe `secrets_profile`; never a value. The worker picks the
profile from PI_SECRET_PROFILES (`name:/abs/path,...`): the one the job names, or the only one declared.
The profile's resolver runs once per reference, as `<resolver> <reference>` (no shell, stdin closed, the
closed environment of every host script: apps/worker/gates/hostscripts.py), within PI_SECRET_RESOLVE_TIMEOUT_MS.
Its answer:

    exit 0, stdout = the value (one trailing newline dropped; not empty, no NUL, UTF-8, <= 64 KiB)
    exit 2                       the reference is wrong: refused `secret-unresolved` (so are an empty
                                 answer, an oversized one, a NUL, invalid UTF-8)
    exit 1, any other exit, a signal, a timeout, a resolver that cannot be spawned
                                 the resolver is unreachable: `secret-resolver-unreachable`, retried

Refusals before any resolver runs: a name the runtime sets itself or pi reads for its provider or forge
(`secret-name-reserved`, checked again here: the receiver's copy of the rule may be older than this
worker's environment), no profile by the job's name or none declared (`secret-profile-unknown`),
several declared and none named (`secret-profile-ambiguous`).

The values go into the container's environment only. Logs carry the job id, the number of names, the
profile name and a reason token; never a value, a reference or a resolver path.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings

from apps.fleet.capabilities import parse_profiles
from apps.worker.forges import forge_client_classes
from apps.worker.gates.hostscripts import run_script
from apps.worker.jobs import JobSpec
from apps.worker.sandbox import providers

logger = logging.getLogger("pidispatch.secrets")

MAX_VALUE_BYTES = 64 * 1024
RESOLVED, UNRESOLVED = 0, 2
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Names the container's runtime or the runner own, and variables that steer where pi, node or git talk to.
RUNTIME_NAMES = frozenset({
    "HOME", "PATH", "USER", "LOGNAME", "SHELL", "PWD", "HOSTNAME", "TERM", "LANG", "LC_ALL", "TMPDIR",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "NODE_USE_ENV_PROXY",
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
    "NODE_OPTIONS", "NODE_EXTRA_CA_CERTS", "LD_PRELOAD", "LD_LIBRARY_PATH",
    "GIT_DIR", "GIT_WORK_TREE", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_SSH_COMMAND", "GIT_ASKPASS",
    "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_BASE", "GOOGLE_API_BASE",
    "GH_HOST", "GL_TOKEN", "GITEA_TOKEN", "GITEA_URL", "GITLAB_URL", "AZURE_TOKEN", "AZURE_ORG_URL",
    "SYSTEM_ACCESSTOKEN",
})
RESERVED_PREFIXES = ("PI_",)  # everything the worker itself passes (PI_JOB_ID, PI_PROVIDER, PI_MODEL, ...)


class SecretsRefused(Exception):
    """A determinate refusal before spend; `reason` is the record's token. Never carries a value."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ResolverUnreachable(Exception):
    """The resolver gave no usable answer (exit 1, an unknown exit, a timeout, no such program): retried."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why  # a fixed token: `exit-1`, `timeout`, `spawn-failed`, ...


def reserved_names() -> frozenset[str]:
    """Every name a secret may not take, from what this worker puts into a container today."""
    provider_keys = providers.known_key_variables()
    forge_names = {name for client in forge_client_classes()
                   for name in (*client.token_variables, client.url_variable) if name}
    return RUNTIME_NAMES | frozenset(name.upper() for name in provider_keys | forge_names)


def is_reserved(name: str, reserved: frozenset[str] | None = None) -> bool:
    """Not a plain environment variable name, or one the runtime, the worker or pi's provider/forge use."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return True
    upper = name.upper()
    return upper in (reserved if reserved is not None else reserved_names()) or upper.startswith(RESERVED_PREFIXES)


def choose_profile(wanted: str, declared: dict[str, str]) -> str:
    """The profile name this job resolves with, or SecretsRefused."""
    if wanted:
        if wanted not in declared:
            raise SecretsRefused("secret-profile-unknown")
        return wanted
    if not declared:
        raise SecretsRefused("secret-profile-unknown")
    if len(declared) > 1:
        raise SecretsRefused("secret-profile-ambiguous")
    return next(iter(declared))


def resolve_one(resolver: str, reference: str, timeout_seconds: float) -> str:
    """One reference's value, or SecretsRefused(`secret-unresolved`) / ResolverUnreachable."""
    if not isinstance(reference, str) or not reference or reference.startswith("-"):
        raise SecretsRefused("secret-unresolved")  # never handed to a resolver as if it were an option
    answer = run_script([resolver, reference], timeout_seconds=timeout_seconds, capture_bytes=MAX_VALUE_BYTES + 1)
    if answer.overflow:
        raise SecretsRefused("secret-unresolved")
    if answer.code == UNRESOLVED:
        raise SecretsRefused("secret-unresolved")
    if answer.code != RESOLVED:
        raise ResolverUnreachable(answer.fault)
    value = answer.stdout[:-1] if answer.stdout.endswith(b"\n") else answer.stdout
    if not value or len(value) > MAX_VALUE_BYTES or b"\0" in value:
        raise SecretsRefused("secret-unresolved")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretsRefused("secret-unresolved") from None


def resolve(spec: JobSpec) -> dict[str, str]:
    """`{ENV_NAME: value}` for the job's secrets ({} when it has none), SecretsRefused or ResolverUnreachable."""
    if not spec.secrets:
        return {}
    count = len(spec.secrets) if isinstance(spec.secrets, dict) else 0
    profile = spec.secrets_profile or "-"
    try:
        if not isinstance(spec.secrets, dict):  # a payload this worker cannot read: nothing to hand a resolver
            raise SecretsRefused("secret-unresolved")
        reserved = reserved_names()
        if any(is_reserved(name, reserved) for name in spec.secrets):
            raise SecretsRefused("secret-name-reserved")
        declared = parse_profiles(settings.PI_SECRET_PROFILES, "PI_SECRET_PROFILES")
        profile = choose_profile(spec.secrets_profile, declared)
        timeout_seconds = settings.PI_SECRET_RESOLVE_TIMEOUT_MS / 1000
        values = {name: resolve_one(declared[profile], reference, timeout_seconds)
                  for name, reference in spec.secrets.items()}
    except SecretsRefused as refused:
        logger.info("secrets_refused job=%s count=%d profile=%s reason=%s", spec.job_id, count, profile,
                    refused.reason)
        raise
    except ResolverUnreachable as fault:
        logger.warning("secrets_resolver_unreachable job=%s count=%d profile=%s reason=secret-resolver-unreachable "
                       "why=%s", spec.job_id, count, profile, fault.why)
        raise
    logger.info("secrets_resolved job=%s count=%d profile=%s", spec.job_id, count, profile)
    return values
