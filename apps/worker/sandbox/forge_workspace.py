"""A forge job's workspace (gate 10): the job's own token, the default branch's current commit, its
protection, a fresh shallow clone, and the repo's `.pi/` from the commit the agent starts at
(apps/worker/sandbox/repo_skills.py).

    workspace = forge_workspace.prepare(spec, dirs, owner=(1000, 1000))   # ForgeFailure / WorkspaceRefused
    workspace.start_sha          # the commit the agent starts from (what its work is measured against)
    workspace.release()          # after the run and its publish step: a minted token is revoked

A job about an issue starts at the default branch's commit, merged under the branch's protection. A job
triggered on a pull request starts at the pull request's head as the forge names it now (fetched from the
base repository's own pull ref, so a fork's head is never fetched from the fork). `.pi/` always comes from
the default branch: a pull request cannot bring the skills its own job follows.

The container holds no forge credential: the token reaches git only as an HTTP header of the worker's own
git (apps/worker/sandbox/gitrun.py), the clone's `origin` is the plain URL, and the worker publishes the agent's work
itself (apps/worker/forges/publishing/). git's stderr is classified into reason tokens, never logged (it names URLs).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from apps.worker.forges import (
    BranchHead,
    Credential,
    ForgeClient,
    ForgeFailure,
    Fork,
    PullHead,
    RepoRef,
    forge_client,
)
from apps.worker.jobs import JobSpec
from apps.worker.sandbox import repo_skills
from apps.worker.sandbox.gitrun import run_git
from apps.worker.sandbox.jobfiles import JobDirs

logger = logging.getLogger("pidispatch.workspace")

# When a server will not hand out a commit by its id, fetch this much of the branch and look for it there.
FALLBACK_DEPTH = 50
COMMIT_UNAVAILABLE = ("not our ref", "couldn't find remote ref", "no such remote ref", "unadvertised object",
                      "bad object", "remote error: upload-pack")
AUTH_REFUSED = ("returned error: 401", "returned error: 403", "authentication failed", "could not read username",
                "could not read password", "invalid credentials")
NOT_FOUND = ("returned error: 404", "repository not found", "not found")


@dataclass
class ForgeWorkspace:
    client: ForgeClient
    credential: Credential
    head: BranchHead  # the default branch as it was when the job started
    pi_files: int
    pull: PullHead | None = None  # a job triggered on a pull request: its head, which the agent starts from
    fork: Fork | None = None  # `run.publishTo: fork`: the deployment's fork, made before the agent runs

    @property
    def start_sha(self) -> str:
        return self.pull.sha if self.pull is not None else self.head.sha

    @property
    def origin_url(self) -> str:
        """The `origin` the workspace's own git config names (the clone's: the forge's clone URL)."""
        return self.head.clone_url

    def release(self) -> None:
        self.client.release_credential(self.credential)


def publishes_to(spec: JobSpec) -> str:
    """`fork` or `origin`: the trigger's run.publishTo, else the deployment's PI_PUBLISH_TO."""
    return spec.publish_to or settings.PI_PUBLISH_TO


def repo_ref(spec: JobSpec) -> RepoRef:
    return RepoRef(repo=spec.repo, project_id=spec.project_id, repository_id=spec.repository_id)


def prepare(spec: JobSpec, dirs: JobDirs, owner: tuple[int, int]) -> ForgeWorkspace:
    """Mint, resolve, check protection, clone, materialise `.pi/`. The clone ends up owned by `owner`."""
    client = forge_client(spec.kind)
    ref = repo_ref(spec)
    credential = client.job_credential(ref)
    try:
        head = client.default_branch(ref, credential)
        if not head.protected:
            # The job's token can merge: an unprotected default branch is one prompt injection from owned.
            raise ForgeFailure("unprotected-branch", transient=False)
        # Made before the agent runs: a forge (or credentials) that cannot fork refuses the job before any spend,
        # never publishing to the origin instead.
        fork = client.fork(ref, credential) if publishes_to(spec) == "fork" else None
        pull = None
        if spec.target_type == "pull_request" and spec.number is not None:
            pull = client.pull_head(ref, spec.number, credential)
            if not pull.open:
                raise ForgeFailure("pull-request-closed", transient=False)
        started = time.perf_counter()
        authorization = client.git_authorization(credential)
        clone_at(dirs.workspace, head, authorization)
        if pull is not None:
            checkout_pull_head(dirs.workspace, pull, authorization)
        pi_files = repo_skills.materialise(dirs.workspace, head.sha, dirs.job / "pi")
        hand_over(dirs.workspace, owner)
    except BaseException:
        client.release_credential(credential)
        raise
    start = pull.sha if pull is not None else head.sha
    logger.info("workspace_cloned job=%s sha=%s pull=%s pi_files=%d clone_ms=%.0f", spec.job_id, start[:12],
                "-" if pull is None else ("same-repo" if pull.same_repository else "fork"), pi_files,
                (time.perf_counter() - started) * 1000)
    return ForgeWorkspace(client=client, credential=credential, head=head, pi_files=pi_files, pull=pull, fork=fork)


def checkout_pull_head(folder: Path, pull: PullHead, authorization: str) -> None:
    """The pull request's head commit, fetched from the base repository's own ref for it, checked out on top
    of the default branch's clone (its `.pi/` was read from the default branch, which stays in the object
    store). A head that moved since the forge named it is `sha-gone`."""
    # Depth 2: where the ref is a merge commit (Azure DevOps, a fork), the head is its second parent.
    fetched = git(folder, "fetch", "-q", "--depth=2", "--no-tags", "origin", f"+{pull.fetch_ref}:refs/pi/pull",
                  authorization=authorization, check=False)
    if fetched.returncode != 0:
        raise classify(fetched.stderr) or ForgeFailure("sha-gone", transient=False)
    if git(folder, "cat-file", "-e", f"{pull.sha}^{{commit}}", check=False).returncode != 0:
        raise ForgeFailure("sha-gone", transient=False)
    git(folder, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", pull.sha)


def clone_at(folder: Path, head: BranchHead, authorization: str) -> None:
    """A detached shallow clone of `head.sha` into the (empty) `folder`. A commit the forge no longer has
    (the branch was force-pushed between resolve and clone) is `sha-gone`."""
    git(folder, "init", "-q", "--template=")
    git(folder, "remote", "add", "origin", head.clone_url)
    fetched = git(folder, "fetch", "-q", "--depth=1", "--no-tags", "origin", head.sha, authorization=authorization,
                  check=False)
    if fetched.returncode != 0:
        failure = classify(fetched.stderr)
        if failure is not None:
            raise failure
        # Servers that refuse a bare commit id: the commit must still be near the branch's tip.
        fetched = git(folder, "fetch", "-q", f"--depth={FALLBACK_DEPTH}", "--no-tags", "origin",
                      f"+refs/heads/{head.name}:refs/remotes/origin/{head.name}", authorization=authorization,
                      check=False)
        if fetched.returncode != 0:
            raise classify(fetched.stderr) or ForgeFailure("sha-gone", transient=False)
        if git(folder, "cat-file", "-e", f"{head.sha}^{{commit}}", check=False).returncode != 0:
            raise ForgeFailure("sha-gone", transient=False)
    git(folder, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", head.sha)


def classify(stderr: str) -> ForgeFailure | None:
    """A failed fetch as a reason; None when the commit itself was what the server would not give."""
    text = stderr.lower()
    if any(marker in text for marker in COMMIT_UNAVAILABLE):
        return None
    if any(marker in text for marker in AUTH_REFUSED):
        return ForgeFailure("forge-auth-refused", transient=False)
    if any(marker in text for marker in NOT_FOUND):
        return ForgeFailure("forge-repo-not-found", transient=False)
    return ForgeFailure("clone-failed", transient=True)  # 5xx, 429, network, a dropped connection


def git(folder: Path, *args: str, authorization: str = "", check: bool = True) -> subprocess.CompletedProcess:
    """git for the clone: a timeout or a failure to run is a transient fault; stderr comes back as text."""
    try:
        result = run_git(folder, *args, authorization=authorization, transport="http",
                         timeout=settings.PI_CLONE_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise ForgeFailure("clone-timeout", transient=True) from None
    except OSError:
        raise ForgeFailure("clone-failed", transient=True) from None
    if check and result.returncode != 0:
        raise ForgeFailure("clone-failed", transient=True)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout,
                                       result.stderr.decode("utf-8", errors="replace"))


def hand_over(folder: Path, owner: tuple[int, int]) -> None:
    """The clone belongs to the container's job user (a root worker cloned it). Links are not followed."""
    if os.geteuid() != 0:
        return  # the job runs as this worker's own user, who wrote the clone
    os.chown(folder, *owner, follow_symlinks=False)
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            os.chown(os.path.join(root, name), *owner, follow_symlinks=False)
