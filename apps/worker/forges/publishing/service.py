"""Publishing a completed forge run: the one home of "the agent's work reaches the forge".

Called by the gate ladder after a completed run (step 14), and by `Publish again` (the admin's action and
`manage.py publish_again`) for work a failed publish kept. The worker, never the agent, talks to the forge:

    commits on top of the start ──> a job triggered on a pull request from this repository:
                                      pushed to that pull request's branch (fast-forward only)
                                    a pull request from a fork: the summary as a comment, nothing pushed
                                    otherwise: pushed to a new branch `pi/<number>-<flow>`, and one pull/merge
                                      request opened against the default branch (draft unless PI_PR_DRAFT=false)
    with `run.publishTo: fork` ──> pushed to a new branch of the deployment's fork (made before the agent ran),
                                      and one pull request opened from there: into the default branch, or into
                                      the triggering pull request's branch; the origin's CI treats it as an
                                      outside contribution and gives it no secret until a person approves it
    no commits ──────────────────> the agent's summary as one comment (nothing-to-publish without one)
    a summary holding a credential ──> nothing published (summary-held-secret), the work kept (messages.py says why)

Never a force push, never the default branch. A transient forge error retries this step (PI_PUBLISH_ATTEMPTS
times, backing off from PI_PUBLISH_RETRY_SECONDS), never the agent; a refusal (the checks in checks.py, the
forge's 401/403/404, a protected branch) ends the run `policy` with its reason. Whenever the work did not
reach the forge it is kept under the job's folder for PI_KEEP_WORK_HOURS: a bundle of its commits and what
publishing it again needs (kept.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from apps import forge_registry
from apps.worker.forges import Credential, ForgeClient, ForgeFailure, Fork, PullHead, RepoRef, forge_client
from apps.worker.forges.publishing import changes as work_changes
from apps.worker.forges.publishing import checks, kept, messages, secret_scan
from apps.worker.forges.publishing.work import Work, WorkUnreadable, bot_identity, collect
from apps.worker.gates.verdicts import Publication
from apps.worker.sandbox.forge_workspace import AUTH_REFUSED, NOT_FOUND
from apps.worker.sandbox.gitrun import run_git

logger = logging.getLogger("pidispatch.publish")

PUBLISHED, COMMENTED, NOTHING = "published", "commented", "nothing-to-publish"
UNAVAILABLE = "publish-unavailable"  # every attempt met a transient forge error: failed, never retried
BRANCH_MOVED = "branch-moved"  # the pull request's branch moved while the agent worked: commented instead
SUMMARY_HELD_SECRET = "summary-held-secret"  # the agent's summary held a credential: nothing published
SECRET_IN_WORK = "secret-in-work"  # a file or commit message of the work held a secret: nothing published
MOVED = ("non-fast-forward", "fetch first", "[rejected]")
REFUSED_BY_REMOTE = ("[remote rejected]", "protected branch", "pre-receive hook declined", "denied")
# A ref another push was updating at the same moment: try again (it is then taken, or ours).
RACED = ("failed to update ref", "cannot lock ref", "failed to lock", "unable to lock")
BRANCH_CHARS = re.compile(r"[^a-z0-9._-]+")
FORK_NOTE = ("This pull request comes from a fork: nothing is pushed to a fork, so the agent's {n} commit(s) stay "
             "unpublished.")
MOVED_NOTE = ("The pull request's branch moved while the agent worked, so its {n} commit(s) were not pushed "
              "(never a force push). The operator can publish them again.")


@dataclass(frozen=True)
class Destination:
    """Where one job's work goes: ids and names only (what `Publish again` keeps on disk too)."""

    kind: str
    ref: RepoRef
    target_type: str
    number: int | None
    job_branch: str  # the new branch for this job's work (unused for a pull request's own branch)
    base_branch: str  # the default branch, which a new pull request targets
    start_sha: str
    clone_url: str
    pull: PullHead | None
    allow_ci_changes: bool
    # `run.publishTo: fork`: the deployment's fork the work is pushed to, its pull request opened from there.
    fork_repo: str = ""
    fork_clone_url: str = ""
    fork_project_id: str = ""

    @property
    def fork(self) -> Fork | None:
        return Fork(repo=self.fork_repo, clone_url=self.fork_clone_url,
                    project_id=self.fork_project_id) if self.fork_repo else None


class PublishRefused(Exception):
    def __init__(self, reason: str, forge_message: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.forge_message = forge_message  # the forge's own words, for the run record (ForgeFailure.forge_message)


class PublishDeferred(Exception):
    """A transient forge error: this step may be tried again, the agent never."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after
        self.reason = reason


def branch_for(spec) -> str:
    """`pi/<number>-<flow>` (`-r<i>` for a replica); `pi/<job id>` for a job without an issue (cron, run)."""
    what = BRANCH_CHARS.sub("-", (spec.flow or spec.command).lower()).strip("-.") or "work"
    name = f"pi/{spec.number}-{what}" if spec.number is not None else f"pi/{spec.job_id}"
    return f"{name}-r{spec.replica}" if spec.replica else name


def destination_for(spec, workspace) -> Destination:
    return Destination(kind=spec.kind, ref=RepoRef(spec.repo, spec.project_id, spec.repository_id),
                       target_type=spec.target_type, number=spec.number, job_branch=branch_for(spec),
                       base_branch=workspace.head.name, start_sha=workspace.start_sha,
                       clone_url=workspace.head.clone_url, pull=workspace.pull,
                       allow_ci_changes=spec.allow_ci_changes,
                       fork_repo=workspace.fork.repo if workspace.fork else "",
                       fork_clone_url=workspace.fork.clone_url if workspace.fork else "",
                       fork_project_id=workspace.fork.project_id if workspace.fork else "")


def named_forge_tokens(workspace) -> dict[str, str]:
    """The forge tokens no published text may hold, by name: the job's own (a GitHub App's is minted for it), and
    each one this deployment is configured with."""
    configured = {f"{name.upper()}_TOKEN": forge_client(name).token for name in forge_registry.NAMES}
    return {"the job's forge token": workspace.credential.token, **configured}


def forge_tokens(workspace) -> list[str]:
    return list(named_forge_tokens(workspace).values())


def publish_run(spec, workspace, job_root: Path, workspace_folder: Path, summary: str, finished_at: float, *,
                credentials: dict[str, str] | None = None,
                job_secrets: dict[str, str] | None = None) -> tuple[Publication, str]:
    """Publish a completed run's work. Returns the publication and the run's reason: "" when the run stays
    completed, a refusal token (policy) or UNAVAILABLE (failed, not retried). Never raises for the forge.
    `credentials` (the provider key by its variable's name; the forge tokens are added here) may not appear in what
    is posted, the job's own secrets (by their names) are scrubbed from it (messages.postable_summary), and none of
    them may be in the work's files or commit messages (secret_scan.py)."""
    destination = destination_for(spec, workspace)
    credentials = {**named_forge_tokens(workspace), **(credentials or {})}
    job_secrets = dict(job_secrets or {})
    summary, held_credential = messages.postable_summary(summary, credentials=credentials, job_secrets=job_secrets)
    worker_message = messages.commit_message(spec, summary)
    try:
        work = collect(workspace_folder, start_sha=destination.start_sha, store=job_root / "publish.git",
                       identity=bot_identity(), origin_url=workspace.origin_url, finished_at=finished_at,
                       message=worker_message)
    except WorkUnreadable as unreadable:
        logger.warning("publish_refused job=%s reason=%s detail=%s", spec.job_id, unreadable.reason,
                       unreadable.detail or "-")
        return Publication(unreadable.reason, refusal=unreadable.detail), unreadable.reason
    described = work_changes.describe(work, [*credentials.values(), *job_secrets.values()],
                                      worker_subject=worker_message.partition("\n")[0])
    if held_credential:
        logger.warning("publish_refused job=%s reason=%s commits=%d", spec.job_id, SUMMARY_HELD_SECRET, work.commits)
        if not work.empty:
            kept.keep(job_root, spec, destination, work, summary)  # the fixed text stands for the summary
        publication = Publication(SUMMARY_HELD_SECRET, pushed_commits=0, changed_files=len(work.changes))
        return _with_changes(publication, described, summary, work), SUMMARY_HELD_SECRET
    found = secret_scan.first_secret(work, {**job_secrets, **credentials})
    if found is not None:
        logger.warning("publish_refused job=%s reason=%s where=%s secret=%s", spec.job_id, SECRET_IN_WORK,
                       found.where, found.secret)
        kept.keep(job_root, spec, destination, work, summary)
        publication = Publication(SECRET_IN_WORK, pushed_commits=0, changed_files=len(work.changes),
                                  refusal=str(found))
        return _with_changes(publication, described, summary, work), SECRET_IN_WORK
    publication, reason = deliver(spec, destination, work, workspace.client, workspace.credential, job_root, summary)
    return _with_changes(publication, described, summary, work), reason


def _with_changes(publication: Publication, described, summary: str, work: Work) -> Publication:
    """The run page's view of the work, saying where its commits are now (deliver keeps what did not get there)."""
    if described is None:
        return publication
    kept_work = not work.empty and publication.outcome not in (PUBLISHED, COMMENTED, NOTHING)
    return dataclasses.replace(publication, changes=described.published(publication.outcome, summary, kept_work))


def deliver(spec, destination: Destination, work: Work, client: ForgeClient, credential: Credential,
            job_root: Path, summary: str) -> tuple[Publication, str]:
    """Checks, then the forge, with retries of transient errors; keeps the work when it did not get there."""
    started = time.perf_counter()
    refusal = None if work.empty else checks.refusal(work, allow_ci_changes=destination.allow_ci_changes,
                                                     max_file_bytes=client.max_file_bytes,
                                                     repository=destination.ref.repo, forge=destination.kind)
    if refusal:
        publication, reason = Publication(refusal, pushed_commits=0), refusal
    else:
        publication, reason = _with_retries(spec, destination, work, client, credential, summary)
    publication = dataclasses.replace(publication, changed_files=len(work.changes))
    if publication.outcome not in (PUBLISHED, COMMENTED, NOTHING) and not work.empty:
        kept.keep(job_root, spec, destination, work, summary)
    logger.info("publish job=%s outcome=%s commits=%d pr=%s publish_ms=%.0f", spec.job_id, publication.outcome,
                work.commits, publication.pull_request or "-", (time.perf_counter() - started) * 1000)
    return publication, reason


def _with_retries(spec, destination, work, client, credential, summary) -> tuple[Publication, str]:
    delay = settings.PI_PUBLISH_RETRY_SECONDS
    for attempt in range(1, settings.PI_PUBLISH_ATTEMPTS + 1):
        try:
            return _publish(spec, destination, work, client, credential, summary), ""
        except PublishRefused as refused:
            return Publication(refused.reason, pushed_commits=0, forge_message=refused.forge_message), refused.reason
        except PublishDeferred as deferred:
            logger.warning("publish_retry job=%s attempt=%d reason=%s retry_after=%s", spec.job_id, attempt,
                           deferred.reason, deferred.retry_after if deferred.retry_after is not None else "-")
            if attempt < settings.PI_PUBLISH_ATTEMPTS:
                # Never sooner than the forge asked; a wait longer than this step's whole backoff would hold the
                # worker: the step gives up instead (the work is kept for Publish again).
                if (deferred.retry_after or 0) > delay * 2 ** (settings.PI_PUBLISH_ATTEMPTS - attempt):
                    break
                time.sleep(max(delay, deferred.retry_after or 0))
                delay *= 2
    return Publication(UNAVAILABLE, pushed_commits=0), UNAVAILABLE


def _forge_call(function, *args, **kwargs):
    try:
        return function(*args, **kwargs)
    except ForgeFailure as failure:
        if failure.transient:
            raise PublishDeferred(failure.reason, failure.retry_after) from None
        raise PublishRefused(failure.reason, failure.forge_message) from None


def _publish(spec, destination: Destination, work: Work, client, credential, summary) -> Publication:
    pull = destination.pull
    if work.empty:
        if not messages._clean(summary):
            return Publication(NOTHING, pushed_commits=0)
        return _comment(spec, destination, client, summary)
    if pull is not None and not pull.same_repository:
        return _comment(spec, destination, client, summary, note=FORK_NOTE.format(n=work.commits))
    fork = destination.fork
    if pull is not None and fork is None:
        pushed = _push(work, destination.clone_url, pull.branch, client, credential)
        if pushed == "moved":
            _comment(spec, destination, client, summary, note=MOVED_NOTE.format(n=work.commits))
            return Publication(BRANCH_MOVED, pull_request=pull.number, pushed_commits=0)
        return Publication(PUBLISHED, pull_request=pull.number, pushed_commits=work.commits)
    # From the fork, a pull request's own work is a pull request into its branch; the rest into the default branch.
    base = pull.branch if pull is not None else destination.base_branch
    branch = _push_job_branch(spec, destination, work, client, credential)
    existing = _forge_call(client.find_pull_request, destination.ref, branch, base, credential, fork)
    if existing is None:
        existing = _forge_call(
            client.open_pull_request, destination.ref, head_branch=branch, base_branch=base,
            title=messages.title(spec, summary), body=messages.body(spec, summary, client.max_description_chars),
            draft=settings.PI_PR_DRAFT, issue_number=destination.number if destination.target_type == "issue" else None,
            credential=credential, fork=fork)
    return Publication(PUBLISHED, pull_request=existing.number, pushed_commits=work.commits, url=existing.url)


def _push_job_branch(spec, destination: Destination, work: Work, client, credential) -> str:
    """The job's branch, pushed to the fork (with the credential the forge gives for it) or to the origin: its
    name, or this job's own suffix on it where earlier work (another job on the same issue) holds the name."""
    fork = destination.fork
    push_url = fork.clone_url if fork is not None else destination.clone_url
    push_credential = _forge_call(client.fork_credential, fork, credential) if fork is not None else credential
    try:
        branch = destination.job_branch
        if _push(work, push_url, branch, client, push_credential) == "moved":
            branch = f"{branch}-{hashlib.sha256(spec.job_id.encode()).hexdigest()[:8]}"
            if _push(work, push_url, branch, client, push_credential) == "moved":
                raise PublishRefused("push-refused")
        return branch
    finally:
        if push_credential is not credential:
            client.release_credential(push_credential)


def _comment(spec, destination, client, summary, note="") -> Publication:
    if destination.number is None:
        return Publication(NOTHING, pushed_commits=0)
    text = messages.body(spec, summary, client.max_comment_chars, note=note)
    _forge_call(client.post_comment, destination.ref, destination.target_type, destination.number, text)
    return Publication(COMMENTED, pushed_commits=0)


def _push(work: Work, clone_url: str, branch: str, client, credential) -> str:
    """`head:refs/heads/<branch>` without force: "ok", or "moved" when the branch holds something else."""
    if branch == "" or branch.startswith("-"):
        raise PublishRefused("push-refused")
    try:
        result = run_git(work.store.parent, "--git-dir", str(work.store), "push", "--porcelain", "--no-verify",
                         clone_url, f"{work.head}:refs/heads/{branch}",
                         authorization=client.git_authorization(credential), transport="http",
                         timeout=settings.PI_CLONE_TIMEOUT_SECONDS)
    except Exception:  # a timeout or a git that cannot run: the forge may be fine next time
        raise PublishDeferred("push-failed") from None
    output = (result.stdout + result.stderr).decode("utf-8", "replace").lower()
    if result.returncode == 0:
        return "ok"
    if any(marker in output for marker in RACED):
        raise PublishDeferred("push-raced")
    if any(marker in output for marker in REFUSED_BY_REMOTE):
        raise PublishRefused("push-refused")
    if any(marker in output for marker in MOVED):
        return "moved"
    if any(marker in output for marker in AUTH_REFUSED):
        raise PublishRefused("forge-auth-refused")
    if any(marker in output for marker in NOT_FOUND):
        raise PublishRefused("forge-repo-not-found")
    raise PublishDeferred("push-failed")
