"""A cron job's folder on GitHub (`run.github: true`): which repository its work is published to, by the worker.

The ancestor mints a GitHub token into such a cron job's container, and the agent pushes (or opens a pull
request) itself. Here the container never holds a token: the worker publishes the agent's commits after a
completed run exactly as it does a forge job's (apps/worker/forges/publishing/): pushed to a new branch
`pi/<job id>` of the repository and one pull request against its default branch (draft unless PI_PR_DRAFT is false).
What differs from the ancestor: the agent cannot reach GitHub's API itself (no comments, labels or releases of its
own), and nothing is published from a run that did not complete.

    forge = folder_forge.prepare(spec, folder, start_sha)     # ForgeFailure / WorkspaceRefused, before any spend
    forge.repo                                                 # `owner/name`, as GitHub names it

The repository is the folder's `origin`, which must be this deployment's GitHub (GITHUB_API_URL's clone URLs)
and the same repository GitHub answers for. Its start (the folder's HEAD when the job began) must already be on
GitHub's default branch: the push then carries the agent's commits and nothing the operator has not published.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from apps.worker.forges import ForgeFailure, RepoRef, forge_client
from apps.worker.sandbox.forge_workspace import ForgeWorkspace
from apps.worker.sandbox.gitrun import run_git
from apps.worker.sandbox.workspace import WorkspaceRefused

GIT_TIMEOUT_SECONDS = 30
SCP_LIKE = re.compile(r"^(?:[^@/]+@)?(?P<host>[^:/]+):(?P<path>[^/].*)$")  # git@github.com:acme/web.git


@dataclass
class FolderOnGitHub(ForgeWorkspace):
    """A ForgeWorkspace whose work starts at the folder's own HEAD, not at a fresh clone's."""

    repo: str = ""
    folder_start: str = ""
    folder_origin: str = ""

    @property
    def start_sha(self) -> str:
        return self.folder_start

    @property
    def origin_url(self) -> str:
        return self.folder_origin


def repository_address(url: str) -> tuple[str, str] | None:
    """(host, `owner/name`) of a remote URL (https, ssh, or scp-like), or None."""
    url = url.strip()
    match = SCP_LIKE.fullmatch(url) if "://" not in url else None
    if match:
        host, path = match["host"], match["path"]
    else:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "ssh", "git") or not parts.hostname:
            return None
        host, path = parts.hostname + (f":{parts.port}" if parts.port and parts.scheme.startswith("http") else ""), \
            parts.path
    segments = [segment for segment in path.strip("/").removesuffix(".git").split("/") if segment]
    if len(segments) < 2:
        return None
    return host.lower(), "/".join(segments[-2:])


def prepare(folder: Path, start_sha: str) -> FolderOnGitHub:
    origin = _git(folder, "config", "--get", "remote.origin.url")
    address = repository_address(origin) if origin else None
    if address is None:
        raise WorkspaceRefused("github-remote-missing", "the folder's origin is not a GitHub repository's URL")
    client = forge_client("github")
    ref = RepoRef(repo=address[1])
    credential = client.job_credential(ref)
    try:
        head = client.default_branch(ref, credential)
        answered = repository_address(head.clone_url)
        if answered is None or (answered[0], answered[1].lower()) != (address[0], address[1].lower()):
            raise WorkspaceRefused("github-remote-mismatch", "the folder's origin is not this deployment's GitHub "
                                                             "repository of that name")
        if _git(folder, "merge-base", "--is-ancestor", start_sha, head.sha) is None:
            raise WorkspaceRefused("github-start-unpublished", "the folder's HEAD is not on GitHub's default branch "
                                                               "(as far as the folder has fetched it)")
    except BaseException:
        client.release_credential(credential)
        raise
    return FolderOnGitHub(client=client, credential=credential, head=head, pi_files=0, repo=address[1],
                          folder_start=start_sha, folder_origin=origin)


def _git(folder: Path, *args: str) -> str | None:
    """The output of a local git command in the folder (no network), or None when it failed."""
    try:
        result = run_git(folder, *args, timeout=GIT_TIMEOUT_SECONDS)
    except (subprocess.TimeoutExpired, OSError):
        raise ForgeFailure("git-unavailable", transient=True) from None
    if result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", "replace").strip()
