"""Outbound forge API clients, one module per forge behind one small interface (`base.ForgeClient`).

    client = forge_client("gitlab")
    client.authority(Subject(project_id="42", actor_id="7"))   # Authority(allowed=True|False|None, reason)
    client.self_identity()                                      # Identity(id=...) or IdentityUnavailable

The receiver asks them who may start work and who "we" are; the worker will add tokens, clones and
comments to the same modules.
"""

from __future__ import annotations

from django.conf import settings

from .azure import AzureClient
from .base import Authority, ForgeClient, Identity, IdentityUnavailable, Subject
from .forgejo import ForgejoClient
from .github import GitHubClient
from .gitlab import GitLabClient

__all__ = ["Authority", "ForgeClient", "Identity", "IdentityUnavailable", "Subject", "forge_client"]


def forge_client(forge: str) -> ForgeClient:
    """A client for `forge` built from the current settings (cheap; the answer cache is shared)."""
    common = {"timeout": settings.PI_FORGE_API_TIMEOUT_SECONDS, "cache_seconds": settings.PI_AUTHORITY_CACHE_SECONDS}
    if forge == "github":
        return GitHubClient(base_url=settings.GITHUB_API_URL, token=settings.GITHUB_TOKEN, **common)
    if forge == "gitlab":
        return GitLabClient(base_url=settings.GITLAB_URL, token=settings.GITLAB_TOKEN, **common)
    if forge == "forgejo":
        return ForgejoClient(base_url=settings.FORGEJO_URL, token=settings.FORGEJO_TOKEN, **common)
    if forge == "azure":
        return AzureClient(base_url=settings.AZURE_ORG_URL, token=settings.AZURE_TOKEN,
                           graph_url=settings.AZURE_GRAPH_URL, **common)
    raise ValueError(f"no API client for forge {forge!r}")
