"""Work that did not reach the forge, kept on the worker host so an operator can publish it again.

    <PI_JOB_ROOT>/<job id>/work.bundle       the commits (git bundle; prerequisite: the start commit)
    <PI_JOB_ROOT>/<job id>/publication.json  where they go: ids, names, the target's title and the agent's
                                             summary (forge text, for the pull request's title and body)
    <PI_JOB_ROOT>/<job id>/KEEP_UNTIL        an ISO instant; until then the folder sweeps leave the folder alone

Everything else of the job's folder (the prompt, the clone) goes as usual. `publish_again(run)` rebuilds the
commits from the bundle on top of a fresh fetch of the start commit and publishes them through the same
service as the first time; on success the kept folder is removed.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from apps.worker.forges import ForgeFailure, PullHead, RepoRef, forge_client
from apps.worker.forges.publishing import work as work_module
from apps.worker.gates.verdicts import Publication
from apps.worker.sandbox import jobfiles
from apps.worker.sandbox.mounts import remove_tree

logger = logging.getLogger("pidispatch.publish")

BUNDLE, DESCRIPTION, KEEP_UNTIL = "work.bundle", "publication.json", jobfiles.KEEP_UNTIL_FILE
# The holder file stays too: the folder sweeps only ever remove a folder whose holder file names its job.
KEPT_FILES = (BUNDLE, DESCRIPTION, KEEP_UNTIL, jobfiles.HOLDER_FILE)


class NothingKept(Exception):
    """No kept work for this run on this host (never kept, expired, published since, or another host's)."""


def keep(job_root: Path, spec, destination, work, summary: str) -> None:
    try:
        work_module.bundle(work, job_root / BUNDLE)
        description = {"jobId": spec.job_id, "spec": _spec_ids(spec), "destination": _destination(destination),
                       "head": work.head, "commits": work.commits, "summary": summary}
        path = job_root / DESCRIPTION
        path.write_text(json.dumps(description))
        path.chmod(0o600)
        until = timezone.now() + timedelta(hours=settings.PI_KEEP_WORK_HOURS)
        (job_root / KEEP_UNTIL).write_text(until.isoformat() + "\n")
    except (OSError, work_module.WorkUnreadable):
        logger.error("publish_work_not_kept job=%s", spec.job_id)
        return
    logger.info("publish_work_kept job=%s commits=%d hours=%d", spec.job_id, work.commits, settings.PI_KEEP_WORK_HOURS)


def is_kept(job_root: Path) -> bool:
    return (job_root / KEEP_UNTIL).exists()


def strip_to_kept(job_root: Path) -> None:
    """The job's folder down to the kept files (the prompt and the clone hold issue text and the repository)."""
    for child in job_root.iterdir():
        if child.name not in KEPT_FILES:
            remove_tree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def _spec_ids(spec) -> dict:
    return {"job_id": spec.job_id, "kind": spec.kind, "repo": spec.repo, "project_id": spec.project_id,
            "repository_id": spec.repository_id, "target_type": spec.target_type, "number": spec.number,
            "flow": spec.flow, "command": spec.command, "replica": spec.replica,
            "title": getattr(spec, "title", "")}  # the pull request's title, forge text like the summary


def _destination(destination) -> dict:
    values = asdict(destination)
    values["ref"] = asdict(destination.ref)
    return values


def kept_folder(job_id: str) -> Path:
    return Path(settings.PI_JOB_ROOT) / job_id


def publish_again(run) -> Publication:
    """Publish a run's kept work again (the operator's `Publish again`). Raises NothingKept."""
    from apps.worker.forges.publishing.service import Destination, deliver
    from apps.worker.records import record_publication

    job_root = kept_folder(run.job_id)
    try:
        description = json.loads((job_root / DESCRIPTION).read_text())
    except (OSError, ValueError):
        raise NothingKept(run.job_id) from None
    values = description["destination"]
    values["ref"] = RepoRef(**values["ref"])
    values["pull"] = PullHead(**values["pull"]) if values.get("pull") else None
    destination = Destination(**values)
    spec = _SpecIds(**description["spec"])
    client = forge_client(destination.kind)
    try:
        credential = client.job_credential(destination.ref)
    except ForgeFailure as failure:
        return Publication(failure.reason, pushed_commits=0)
    try:
        work = _rebuild(job_root, destination, description, client, credential)
        publication, _ = deliver(spec, destination, work, client, credential, job_root, description["summary"])
    finally:
        client.release_credential(credential)
    record_publication(run, publication)
    if publication.outcome in ("published", "commented"):
        remove_tree(job_root)
    return publication


def _rebuild(job_root: Path, destination, description: dict, client, credential):
    """The kept commits in a fresh repository of the worker's: the start commit from the forge, the rest from
    the bundle."""
    store = job_root / "publish.git"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(mode=0o700)
    git = work_module.git
    git(store, "init", "-q", "--bare")
    git(store, "fetch", "-q", "--depth=1", "--no-tags", destination.clone_url, destination.start_sha,
        authorization=client.git_authorization(credential), transport="http")
    git(store, "fetch", "-q", "--no-tags", str(job_root / BUNDLE),
        f"{work_module.PUBLISHED_REF}:{work_module.PUBLISHED_REF}", transport="file")
    head = git(store, "rev-parse", work_module.PUBLISHED_REF).stdout.strip()
    if head != description["head"]:
        raise NothingKept(description["jobId"])
    return work_module.work_between(store, destination.start_sha, head, description["commits"])


class _SpecIds:
    """What publishing reads of a job, rebuilt from the kept description (of its texts, only the title)."""

    def __init__(self, **values):
        self.__dict__.update(values)
