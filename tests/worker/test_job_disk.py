"""What a job may take of the disk: a workspace past PI_JOB_DISK_MB (its files' apparent sizes) or PI_JOB_MAX_FILES
stops the job `workspace-too-large` before anything of it is published (a local job's folder counts only what the
job added), and a full disk while a job is prepared is a retried fault (`disk-full`), never the worker's own bug."""

import os
import subprocess

import pytest
from rq.job import Job

from apps.worker.models import Outcome, Run
from tests.jobspecs import enqueue_spec, forge_spec, local_spec
from tests.local_repos import OWNER, git

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

SMALL_DISK = {"PI_JOB_DISK_MB": "2", "PI_JOB_DISK_POLL_SECONDS": "0.2", "PI_JOB_TIMEOUT_SECONDS": "30"}


def runs(job_id):
    return list(Run.objects.filter(job_id=job_id).order_by("attempt"))


def test_a_workspace_that_outgrows_the_limit_stops_the_job(run_worker):
    enqueue_spec(forge_spec("gh-disk-hog", body="fake-agent:write-mb=3 fake-agent:sleep=30"))

    run_worker("pi-jobs", env_overrides=SMALL_DISK)

    (run,) = runs("gh-disk-hog")
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "workspace-too-large", True)
    assert (run.ended_at - run.started_at).total_seconds() < 20  # stopped, not left to its sleep or timeout


def test_a_sparse_file_counts_as_long_as_it_says_even_when_written_just_before_the_end(run_worker, github_stand_in):
    """4 GiB that occupy no block: `git add` would still read all of it. Written in the last moment of the run
    (the watch's next sample is an hour away), it is caught by the look after the container ended."""
    enqueue_spec(forge_spec("gh-disk-sparse", body="fake-agent:sparse-mb=4096"))

    run_worker("pi-jobs", env_overrides={**SMALL_DISK, "PI_JOB_DISK_POLL_SECONDS": "3600"})

    (run,) = runs("gh-disk-sparse")
    assert (run.outcome, run.reason, run.publish_outcome) == (Outcome.POLICY, "workspace-too-large", "")
    assert github_stand_in.created_pull_requests == []


def test_many_empty_files_stop_the_job(run_worker, github_stand_in):
    """Empty files occupy no block either, yet each is an inode and a walk for the host and for git."""
    enqueue_spec(forge_spec("gh-disk-files", body="fake-agent:empty-files=3000 fake-agent:sleep=30"))

    run_worker("pi-jobs", env_overrides={**SMALL_DISK, "PI_JOB_MAX_FILES": "1000"})

    (run,) = runs("gh-disk-files")
    assert (run.outcome, run.reason, run.publish_outcome) == (Outcome.POLICY, "workspace-too-large", "")
    assert (run.ended_at - run.started_at).total_seconds() < 20  # stopped, not left to its sleep
    assert github_stand_in.created_pull_requests == []


def test_a_local_folder_counts_only_what_the_job_adds(repo, run_worker):  # noqa: F811
    (repo / "big.bin").write_bytes(b"\1" * 3 * 1024 * 1024)  # more than the limit, already there
    git(repo, "add", "big.bin")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "big")
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, *OWNER)
    enqueue_spec(local_spec("run-disk-within", str(repo), task="fake-agent:write-mb=1"))
    # Its folder now holds the first job's 1 MiB too (hence forced: the tree is dirty), which it overwrites.
    enqueue_spec(local_spec("run-disk-past", str(repo), task="fake-agent:write-mb=4 fake-agent:sleep=30", force=True))

    run_worker("pi-jobs", env_overrides=SMALL_DISK)

    (within,) = runs("run-disk-within")
    (past,) = runs("run-disk-past")
    assert within.outcome == Outcome.COMPLETED
    assert (past.outcome, past.reason) == (Outcome.POLICY, "workspace-too-large")
    assert (repo / "big.bin").stat().st_size == 3 * 1024 * 1024  # the operator's own file is never touched


@pytest.fixture
def full_job_root(settings, tmp_path):
    """PI_JOB_ROOT on a 64 KiB filesystem of its own."""
    root = tmp_path / "tiny"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(root)], check=True)
    settings.PI_JOB_ROOT = root
    yield root
    subprocess.run(["umount", str(root)], check=True)


def test_a_full_disk_while_preparing_is_a_retried_fault_and_leaves_nothing(full_job_root, run_worker, redis_conn):
    enqueue_spec(forge_spec("gh-disk-full", body="x" * 200_000))  # its prompt alone cannot fit

    result = run_worker("pi-jobs", env_overrides={"PI_JOB_ROOT": str(full_job_root)})

    (run,) = runs("gh-disk-full")
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.FAILED, "disk-full", False)
    assert Job.fetch("gh-disk-full", connection=redis_conn).get_status() == "scheduled"  # its retry
    assert "job_disk_full job=gh-disk-full error=ENOSPC" in result.stderr
    assert list(full_job_root.iterdir()) == []

