"""The worker's git runs in repositories the agent wrote, so it must be a git fixed against lazy fetching
(CVE-2024-32004, CVE-2024-32465: 2.39.4, 2.40.2, 2.41.1, 2.42.2, 2.43.4, 2.44.1, 2.45.1, or any later line): on an
older one the worker does not start, naming the version and what to install (`doctor` fails too:
tests/worker/test_doctor.py)."""

import os

import pytest

from apps.worker.models import Run
from apps.worker.sandbox.gitrun import git_problem
from tests.jobspecs import enqueue_spec, forge_spec


@pytest.mark.parametrize("output, shown, install", [
    ("git version 2.39.3", "git 2.39.3", "git 2.39.4 or later"),
    ("git version 2.40.1", "git 2.40.1", "git 2.40.2 or later"),
    ("git version 2.43.3", "git 2.43.3", "git 2.43.4 or later"),
    ("git version 2.45.0", "git 2.45.0", "git 2.45.1 or later"),
    ("git version 2.45.0.windows.1", "git 2.45.0", "git 2.45.1 or later"),
    ("git version 2.39.3 (Apple Git-146)", "git 2.39.3", "git 2.39.4 or later"),
    ("git version 2.30.2", "git 2.30.2", "2.39.4, 2.40.2, 2.41.1, 2.42.2, 2.43.4, 2.44.1, 2.45.1 or later on its line"),
    ("git version 1.8.3.1", "git 1.8.3", "or any later line"),
])
def test_a_git_before_its_lines_fixed_release_is_named_with_what_to_install(output, shown, install):
    problem, fix = git_problem(output)
    assert problem.startswith(f"{shown} lets a repository the agent wrote") and "CVE-2024-32004" in problem
    assert install in fix


@pytest.mark.parametrize("output", ["git version 2.39.4", "git version 2.39.5", "git version 2.40.2",
                                    "git version 2.44.1", "git version 2.45.1", "git version 2.45.2.windows.1",
                                    "git version 2.46.0", "git version 2.47.0.rc1", "git version 3.0.0"])
def test_a_fixed_git_is_fine(output):
    assert git_problem(output) is None


def test_output_that_is_no_git_version_is_a_problem_too():
    problem, _ = git_problem("bash: git: command not found")
    assert "cannot tell which git" in problem


@pytest.fixture
def old_git(tmp_path):
    """A `git` first on PATH that is 2.39.3 (before the fix)."""
    folder = tmp_path / "old-git"
    folder.mkdir()
    script = folder / "git"
    script.write_text("#!/bin/sh\necho 'git version 2.39.3'\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


@pytest.mark.django_db(transaction=True)
def test_the_worker_does_not_start_on_an_old_git(run_worker, old_git):
    enqueue_spec(forge_spec("gh-old-git"))

    result = run_worker("pi-jobs", env_overrides=old_git, check=False)

    assert result.returncode != 0
    assert "git 2.39.3 lets a repository the agent wrote" in result.stderr
    assert "install git 2.39.4 or later" in result.stderr
    assert not Run.objects.filter(job_id="gh-old-git").exists()  # no job taken
