"""Local jobs: the folder itself is the workspace (a git repo with a commit; dirty refused unless forced),
the container runs as the folder's owner, one job per folder at a time, and `dispatch_run` queues them."""

import os
import shutil
import subprocess
import sys

import pytest

from apps.worker.models import Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import enqueue_spec, local_spec
from tests.local_repos import OWNER, committed_repository, git

pytestmark = pytest.mark.django_db(transaction=True)
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
    from tests.process_support import ContainerLifetimes, assert_no_overlap

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


def chown_tree(folder, owner=OWNER):
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *owner)


def stat_dirty(folder):
    """Give README.md a new mtime: git status must then read it again, through its clean filter if any."""
    later = (folder / "README.md").stat().st_mtime + 3600
    os.utime(folder / "README.md", (later, later))


def plain_git_status(folder):
    """`git status` as the folder's owner would run it themselves (no system or global config)."""
    subprocess.run(["git", "-C", str(folder), "status"], user=OWNER[0], group=OWNER[1], extra_groups=[],
                   env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"},
                   capture_output=True, timeout=30)


def with_filter(git_dir, program, config_file=None):
    """A clean filter for every path, as the agent could write it into a git directory it can reach (and
    into `config_file` rather than the git directory's own config)."""
    (git_dir / "info").mkdir(exist_ok=True)
    (git_dir / "info" / "attributes").write_text("* filter=marker\n")
    config_file = config_file or git_dir / "config"
    subprocess.run(["git", "config", "--file", str(config_file), "filter.marker.clean", program], check=True)


def worktree_config(repo, program):
    git(repo, "config", "extensions.worktreeConfig", "true")
    with_filter(repo / ".git", program, config_file=repo / ".git" / "config.worktree")


def git_file(repo, program):
    elsewhere = repo.parent / f"{repo.name}-elsewhere.git"
    (repo / ".git").rename(elsewhere)
    (repo / ".git").write_text(f"gitdir: {elsewhere}\n")
    with_filter(elsewhere, program)


def git_symlink(repo, program):
    elsewhere = repo.parent / f"{repo.name}-elsewhere.git"
    (repo / ".git").rename(elsewhere)
    (repo / ".git").symlink_to(elsewhere)
    with_filter(elsewhere, program)


def common_dir(repo, program):
    elsewhere = repo.parent / f"{repo.name}-common.git"
    shutil.copytree(repo / ".git", elsewhere)
    (repo / ".git" / "commondir").write_text(f"{elsewhere}\n")
    with_filter(elsewhere, program)


def included_file(repo, program, key="include.path"):
    included = repo.parent / f"{repo.name}-included.config"
    with_filter(repo / ".git", program, config_file=included)
    git(repo, "config", key, str(included))


def included_if(repo, program):
    included_file(repo, program, key=f"includeIf.gitdir:{repo}/.path")


def embedded_repository(repo, program, declared=False):
    """A repository inside the repository: its index holds a gitlink, and status runs git inside it."""
    inner = committed_repository(repo / "lib", readme="inner\n")
    if declared:
        (repo / ".gitmodules").write_text('[submodule "lib"]\n\tpath = lib\n\turl = ./lib\n')
        git(repo, "add", ".gitmodules")
    git(repo, "add", "lib")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "lib")
    with_filter(inner / ".git", program)
    stat_dirty(inner)


def submodule(repo, program):
    embedded_repository(repo, program, declared=True)


def fsmonitor(repo, program):
    git(repo, "config", "core.fsmonitor", program)


# Each makes plain `git status` in the folder run a program from somewhere the agent can write.
RUNS_A_PROGRAM = [worktree_config, git_file, git_symlink, common_dir, included_file, included_if,
                  embedded_repository, submodule, fsmonitor]


def other_work_tree(repo, _program):
    elsewhere = repo.parent / f"{repo.name}-tree"
    shutil.copytree(repo, elsewhere, ignore=shutil.ignore_patterns(".git"))
    git(repo, "config", "core.worktree", str(elsewhere))


def promisor_remote(repo, _program):
    """A partial clone: status fetches the objects it misses from a remote the agent can rename."""
    git(repo, "config", "core.repositoryFormatVersion", "1")
    git(repo, "config", "remote.origin.url", "https://example.invalid/elsewhere.git")
    git(repo, "config", "remote.origin.promisor", "true")
    git(repo, "config", "extensions.partialClone", "origin")


@pytest.fixture
def markers(owner_space):
    folder = owner_space / "markers"
    folder.mkdir()
    os.chown(folder, *OWNER)
    return folder


@pytest.fixture
def make_repo(owner_space):
    return lambda name: committed_repository(owner_space / name)


def test_a_repository_whose_git_would_run_a_program_is_refused_without_running_it(make_repo, markers, run_worker):
    jobs = {}
    for make_hostile in RUNS_A_PROGRAM + [other_work_tree, promisor_remote]:
        name = make_hostile.__name__
        repo = make_repo(name)
        make_hostile(repo, f"touch {markers / name}; cat")
        chown_tree(repo.parent)
        if make_hostile in RUNS_A_PROGRAM:  # the folder really is hostile: its owner's own git runs the program
            stat_dirty(repo)
            plain_git_status(repo)
            assert (markers / name).exists(), f"{name}: plain git status ran no program"
            (markers / name).unlink()
            stat_dirty(repo)
        jobs[name] = enqueue_spec(local_spec(f"run-{name.replace('_', '-')}", str(repo)))

    run_worker("pi-jobs")

    reasons = {name: Run.objects.get(job_id=job_id).reason for name, job_id in jobs.items()}
    assert reasons == dict.fromkeys(jobs, "workspace-config-unsafe")
    assert sorted(path.name for path in markers.iterdir()) == []


def test_dispatch_run_names_the_unsafe_setting_and_where_it_is(make_repo, markers, worker_env, redis_conn):
    repo = make_repo("app")
    worktree_config(repo, f"touch {markers / 'ran'}; cat")
    chown_tree(repo.parent)
    stat_dirty(repo)

    result = dispatch_run(worker_env, str(repo), "--task", "x")

    assert result.returncode != 0
    assert f"filter.marker.clean ({repo}/.git/config.worktree)" in result.stderr
    assert "extensions.worktreeconfig" in result.stderr
    assert not (markers / "ran").exists() and redis_conn.keys("rq:job:*") == []


def test_hooks_and_a_hooks_path_are_accepted_and_never_run(make_repo, markers, run_worker):
    """post-index-change runs whenever status rewrites the index; every git call here turns hooks off."""
    repo = make_repo("app")
    hook = f"#!/bin/sh\ntouch {markers}/hook-$(basename $(dirname $0))\n"
    for hooks in (repo / ".git" / "hooks", repo / ".git" / "husky"):
        hooks.mkdir(exist_ok=True)
        (hooks / "post-index-change").write_text(hook)
        (hooks / "post-index-change").chmod(0o755)
    chown_tree(repo.parent)
    stat_dirty(repo)
    plain_git_status(repo)
    assert (markers / "hook-hooks").exists()
    (markers / "hook-hooks").unlink()
    git(repo, "config", "core.hooksPath", str(repo / ".git" / "husky"))
    chown_tree(repo.parent)
    stat_dirty(repo)
    job_id = enqueue_spec(local_spec("run-hooks", str(repo)))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert sorted(path.name for path in markers.iterdir()) == []


def test_a_harmless_config_value_is_accepted(repo, run_worker):
    git(repo, "config", "core.fsmonitor", "false")
    job_id = enqueue_spec(local_spec("run-fsmonitor-off", str(repo)))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
