"""The forges as the worker reaches them: API clients, one module per forge behind one small interface
(`base.ForgeClient`); the status sentences posted on issues (`comments.py`); and publishing a run's work
(`publishing/`: the branch, the pull request, kept work).

    client = forge_client("gitlab")
    client.authority(Subject(project_id="42", actor_id="7"))   # Authority(allowed=True|False|None, reason)
    client.self_identity()                                      # Identity(id=...) or IdentityUnavailable
    credential = client.job_credential(RepoRef("group/proj", project_id="42"))   # or ForgeFailure
    client.default_branch(ref, credential)                      # BranchHead(name, sha, protected, clone_url)
    client.post_comment(ref, "issue", 7, "Refused: ... Not run.")
    client.pull_head(ref, 12, credential)                       # PullHead(number, sha, branch, same_repository,
                                                                #          fetch_ref, open)
    client.find_pull_request(ref, "pi/issue-7", "main", credential)          # PullRequest(number, url) or None
    client.open_pull_request(ref, head_branch="pi/issue-7", base_branch="main", title=..., body=..., draft=True,
                             issue_number=7, credential=credential)          # PullRequest (an open one reused)

The receiver asks them who may start work and who "we" are; the worker mints a job's token, resolves and
clones the default branch (apps/worker/sandbox/forge_workspace.py), posts status comments
(apps/worker/forges/comments.py) and publishes a run's work through the pull request calls (within
`max_comment_chars`, `max_file_bytes`).
"""

from __future__ import annotations

from django.conf import settings

from apps import forge_registry
from apps.worker.forges.base import (
    Authority,
    BranchHead,
    Credential,
    ForgeClient,
    ForgeFailure,
    Fork,
    Identity,
    IdentityUnavailable,
    PullHead,
    PullRequest,
    RepoRef,
    Subject,
)
from apps.worker.forges.github_app import AppKeyError, GitHubApp, load_private_key

__all__ = ["Authority", "BranchHead", "Credential", "ForgeClient", "ForgeFailure", "Fork", "Identity",
           "IdentityUnavailable", "PullHead", "PullRequest", "RepoRef", "Subject", "forge_client",
           "forge_client_classes", "github_app_problem"]


def github_app_problem() -> str:
    """What is wrong with the GitHub App settings ("" when it is complete or not configured at all)."""
    if not str(settings.GITHUB_APP_ID).strip():
        return ""
    if not str(settings.GITHUB_APP_ID).strip().isdigit():
        return "GITHUB_APP_ID must be the App's numeric id (the App's settings page, 'App ID')"
    if not str(settings.GITHUB_APP_INSTALLATION_ID).strip().isdigit():
        return ("GITHUB_APP_INSTALLATION_ID must be the numeric id of the App's installation on your account "
                "(the number at the end of the installation's settings URL)")
    try:
        load_private_key(settings.GITHUB_APP_PRIVATE_KEY, settings.GITHUB_APP_PRIVATE_KEY_PATH)
    except AppKeyError as error:
        return str(error)
    return ""


def github_app_from_settings(timeout: float) -> GitHubApp | None:
    if not str(settings.GITHUB_APP_ID).strip():
        return None
    # An incomplete App is still an App: every use of it fails as `forge-unconfigured` (and logs why), so a
    # half-configured deployment never falls back to a broader personal token behind the operator's back.
    problem = github_app_problem()
    key = "" if problem else load_private_key(settings.GITHUB_APP_PRIVATE_KEY, settings.GITHUB_APP_PRIVATE_KEY_PATH)
    return GitHubApp(app_id=str(settings.GITHUB_APP_ID).strip(),
                     installation_id=str(settings.GITHUB_APP_INSTALLATION_ID).strip(),
                     private_key=key, api_url=settings.GITHUB_API_URL, timeout=timeout, problem=problem)


def forge_client_classes() -> tuple[type[ForgeClient], ...]:
    """Every forge's client class (`token_variables` and `url_variable` name what a job's secrets may not be)."""
    return tuple(forge_registry.client_class(name) for name in forge_registry.NAMES)


def forge_client(forge: str) -> ForgeClient:
    """A client for `forge` built from the current settings (cheap; the answer caches are shared)."""
    try:
        client_class = forge_registry.client_class(forge)
    except ValueError:
        raise ValueError(f"no API client for forge {forge!r}") from None
    return client_class.from_settings(timeout=settings.PI_FORGE_API_TIMEOUT_SECONDS,
                                      cache_seconds=settings.PI_AUTHORITY_CACHE_SECONDS,
                                      web_root=forge_registry.web_root(forge))
