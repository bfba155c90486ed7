"""`run.github: true` on a cron trigger (issue 29 §3): the job works in its folder on the worker host, and after a
completed run the worker, not the agent, publishes its commits to the folder's GitHub repository (its origin), as
it does a forge job's: a branch `pi/<job id>` pushed over smart HTTP to a real local git remote, and a pull
request opened on the stand-in GitHub. The container never holds a token."""

import os
import subprocess

import pytest

from apps.worker.models import Outcome, Run
from apps.worker.sandbox.folder_forge import repository_address
from tests.conftest import FORGE_TOKEN_NAMES, joined
from tests.jobspecs import enqueue_spec, local_spec
from tests.local_repos import OWNER
from tests.worker.test_worker_forge_jobs import PAT, container_env_while_running, github  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def git(folder, *args) -> str:
    return subprocess.run(["git", "-c", f"safe.directory={folder}", "-C", str(folder), *args], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture
def site(github, owner_space):  # noqa: F811
    """The cron job's folder: a clone of acme/web whose origin is the stand-in GitHub's URL for it."""
    folder = owner_space / "site"
    subprocess.run(["git", "clone", "-q", str(github.bare), str(folder)], check=True, capture_output=True)
    git(folder, "remote", "set-url", "origin", f"{github.url}/git/acme/web.git")
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *OWNER)
    return folder


def cron_spec(job_id, folder, **fields):
    return local_spec(job_id, str(folder), task="fake-agent:sleep=2", github=True, trigger_type="cron", **fields)


def test_a_cron_jobs_work_is_published_to_its_folders_github_repository(github, site, run_worker):  # noqa: F811
    job_id = enqueue_spec(cron_spec("cron-9-1800000000", site))
    seen: dict = {}
    watcher = container_env_while_running(job_id, seen)

    run_worker("pi-jobs", env_overrides=github.env)
    joined(watcher, 100, "the container watcher")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.publish_outcome) == (Outcome.COMPLETED, "", "published"), run.reason
    (pull,) = github.pulls_of("github", "acme/web")
    assert (pull["head"], run.pull_request) == (f"pi/{job_id}", pull["number"])
    branch = git(github.bare, "rev-parse", f"refs/heads/pi/{job_id}")
    assert "fake pi output" in git(github.bare, "show", f"{branch}:pi-output.md")
    assert git(github.bare, "rev-parse", f"{branch}~1") == github.sha  # the agent's work, on what GitHub had
    assert not set(seen) & FORGE_TOKEN_NAMES and PAT not in str(seen)  # the container never held the token


@pytest.mark.parametrize("break_it, reason", [
    (lambda folder: git(folder, "remote", "remove", "origin"), "github-remote-missing"),
    (lambda folder: git(folder, "remote", "set-url", "origin", "https://elsewhere.example/acme/web.git"),
     "github-remote-mismatch"),
    (lambda folder: git(folder, "-c", "user.name=o", "-c", "user.email=o@example.invalid", "commit", "-q",
                                "--allow-empty", "-m", "not pushed"), "github-start-unpublished"),
])
def test_a_folder_whose_work_cannot_be_published_is_refused_before_it_spends(github, site, run_worker,  # noqa: F811
                                                                            break_it, reason):
    break_it(site)
    for path in [site, *site.rglob("*")]:
        os.lchown(path, *OWNER)
    job_id = enqueue_spec(cron_spec("cron-9-1800000060", site))

    run_worker("pi-jobs", env_overrides=github.env)

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, reason, False)
    assert github.pulls_of("github", "acme/web") == []


@pytest.mark.parametrize("url, address", [
    ("https://github.com/acme/web.git", ("github.com", "acme/web")),
    ("git@github.com:acme/web.git", ("github.com", "acme/web")),
    ("ssh://git@github.com/acme/web", ("github.com", "acme/web")),
    ("http://127.0.0.1:8080/git/acme/web.git", ("127.0.0.1:8080", "acme/web")),
    ("/srv/git/web.git", None),
    ("https://github.com/web", None),
])
def test_the_repository_a_remote_url_names(url, address):
    assert repository_address(url) == address
