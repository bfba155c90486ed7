"""Local jobs: the folder itself is the workspace (a git repo with a commit; dirty refused unless forced),
the container runs as the folder's owner, one job per folder at a time, and `dispatch_run` queues them."""

import os
import shutil
import subprocess
import sys
import tempfile

from pathlib import Path

import pytest

from apps.worker.models import Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import enqueue_spec, local_spec

pytestmark = pytest.mark.django_db(transaction=True)
OWNER = (1234, 1234)


def git(folder, *args):
    subprocess.run(["git", "-c", f"safe.directory={folder}", "-C", str(folder), *args], check=True,
                   capture_output=True)


@pytest.fixture
def owner_space():
    """A folder the repositories' owner can reach (pytest's own temp folders are root-only, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="pidispatch-local-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def repo(owner_space):
    folder = owner_space / "app"
    folder.mkdir()
    git(folder, "init", "-q", "-b", "main")
    (folder / "README.md").write_text("hello\n")
    git(folder, "add", ".")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "init")
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *OWNER)
    return folder


def test_a_local_job_works_in_the_folder_as_its_owner(repo, run_worker):
    job_id = enqueue_spec(local_spec("run-local-1", str(repo), task="fake-agent:report"))

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.target, run.scope) == (Outcome.COMPLETED, "local:app", "local:app")
    output = repo / "pi-output.md"
    assert output.exists() and (output.stat().st_uid, output.stat().st_gid) == OWNER
    assert '"uid": 1234' in (repo / "sandbox-report.json").read_text()


def test_a_dirty_tree_is_refused_unless_forced(repo, run_worker):
    (repo / "README.md").write_text("changed\n")
    refused = enqueue_spec(local_spec("run-dirty", str(repo)))
    forced = enqueue_spec(local_spec("run-forced", str(repo), force=True))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=refused).reason == "workspace-dirty"
    assert Run.objects.get(job_id=forced).outcome == Outcome.COMPLETED


@pytest.mark.parametrize("break_it, reason", [
    (lambda folder: subprocess.run(["rm", "-rf", str(folder / ".git")], check=True), "workspace-not-a-repo"),
    (lambda folder: os.chown(folder, 0, 0), "job-user-unmappable"),
    (lambda folder: subprocess.run(["rm", "-rf", str(folder)], check=True), "workspace-missing"),
])
def test_unusable_folders_are_refused_with_a_reason(repo, run_worker, break_it, reason):
    break_it(repo)
    job_id = enqueue_spec(local_spec("run-broken", str(repo)))

    run_worker("pi-jobs")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, reason, False)


def test_a_repository_without_a_commit_is_refused(owner_space, run_worker):
    folder = owner_space / "empty"
    folder.mkdir()
    git(folder, "init", "-q")
    os.chown(folder, *OWNER)
    job_id = enqueue_spec(local_spec("run-nocommit", str(folder)))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).reason == "workspace-no-commit"


def test_one_job_per_folder_at_a_time(repo, start_worker):
    from tests.test_scope_concurrency import ContainerLifetimes, assert_no_overlap

    lifetimes = ContainerLifetimes()
    for index in range(2):
        enqueue_spec(local_spec(f"run-mutex-{index}", str(repo), task="fake-agent:sleep=2", force=True))

    for _ in range(2):
        start_worker("pi-jobs", env={"PI_SCOPE_BUSY_RECHECK_SECONDS": "1"})

    wait_for(lambda: Run.objects.count() == 2, timeout=120, interval=0.5, what="two runs")
    wait_for(lambda: len(lifetimes.intervals()) == 2, timeout=10, what="container events")
    lifetimes.close()
    assert_no_overlap(lifetimes.intervals())


def dispatch_run(worker_env, *args):
    return subprocess.run([sys.executable, "manage.py", "dispatch_run", *args], cwd=ROOT, env=worker_env,
                          capture_output=True, text=True)


def test_dispatch_run_queues_on_this_hosts_queue_and_the_worker_runs_it(repo, worker_env, run_worker):
    env = {**worker_env, "PI_WORKER_NAME": "hostA"}
    result = subprocess.run([sys.executable, "manage.py", "dispatch_run", str(repo), "--task", "Tidy the README"],
                            cwd=ROOT, env=env, capture_output=True, text=True)

    assert result.returncode == 0, result.stderr
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith("queued run-") and first_line.endswith(f"for {repo} on pi-jobs@hostA")
    job_id = first_line.split()[1]

    run_worker("pi-jobs", "pi-jobs@hostA", env_overrides={"PI_WORKER_NAME": "hostA"})

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.flow, run.host, run.queue) == (Outcome.COMPLETED, "task", "hostA", "pi-jobs@hostA")
    assert "Tidy the README" not in str(list(Run.objects.values()))


@pytest.mark.parametrize("extra, message", [
    (["--task", "x", "--flow", "Bad Flow"], "--flow"),
    (["--task", "  "], "--task is empty"),
    (["--task", "x", "--image", "-rm"], "--image"),
])
def test_dispatch_run_refuses_bad_flags(repo, worker_env, extra, message):
    result = dispatch_run(worker_env, str(repo), *extra)
    assert result.returncode != 0 and message in result.stderr


def test_dispatch_run_refuses_a_dirty_tree_with_what_to_do(repo, worker_env, redis_conn):
    (repo / "new.txt").write_text("x")

    result = dispatch_run(worker_env, str(repo), "--task", "x")

    assert result.returncode != 0
    assert "uncommitted changes" in result.stderr and "--force" in result.stderr
    assert redis_conn.keys("rq:job:*") == []
    assert dispatch_run(worker_env, str(repo), "--task", "x", "--force").returncode == 0


def test_a_repository_whose_config_would_run_a_program_is_refused_without_running_it(repo, run_worker, owner_space):
    marker = owner_space / "ran"
    git(repo, "config", "core.fsmonitor", f"touch {marker}")
    job_id = enqueue_spec(local_spec("run-fsmonitor", str(repo)))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).reason == "workspace-config-unsafe"
    assert not marker.exists()


def test_a_harmless_config_value_is_accepted(repo, run_worker):
    git(repo, "config", "core.fsmonitor", "false")
    job_id = enqueue_spec(local_spec("run-fsmonitor-off", str(repo)))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
