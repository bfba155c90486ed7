"""A labelled issue, end to end on the forge side: the signed delivery through the receiver, a real
`manage.py rqworker`, a real container whose /workspace is a fresh clone of the default branch at the
commit the forge named, with the job's own token in its environment and nothing else of the worker's; and
each way the forge side refuses or retries, with the one comment it leaves on the (local, fake) forge."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import docker
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from rq import Queue

from apps.worker.forges import comments
from apps.worker.models import Outcome, Run
from tests.conftest import CONTAINER_ENV, FORGE_TOKEN_NAMES, SHELL_OWN_ENV, joined, wait_for
from tests.receiver_support import basic, commit_files, deliver, make_repository, prune_unreachable

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

PAT = "ghp-e2e-token"
COMMENTS = "/repos/acme/web/issues/7/comments"
FILES = {"README.md": "# web\n", "app/main.py": "print('web')\n", ".pi/skills/fix-bug/SKILL.md": "# Fix a bug\n",
         ".pi/APPEND_SYSTEM.md": "House style: short commits.\n"}



@pytest.fixture
def github(fake_forge, tmp_path):
    """`acme/web` on a local GitHub: protected `main`, cloned over smart HTTP with the PAT."""
    root = tmp_path / "remote"
    fake_forge.sha = make_repository(root, "acme/web", FILES)
    fake_forge.bare = root / "acme/web.git"
    fake_forge.serve_git(root, basic("x-access-token", PAT))
    fake_forge.github_repository("acme/web", fake_forge.sha)
    fake_forge.env = {"GITHUB_API_URL": fake_forge.url, "GITHUB_TOKEN": PAT}
    return fake_forge


def job_root(settings, job_id: str) -> Path:
    return Path(settings.PI_JOB_ROOT) / job_id


def git_head(folder: Path) -> str:
    return subprocess.run(["git", "-c", f"safe.directory={folder}", "-C", str(folder), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def container_env_while_running(job_id: str, seen: dict) -> threading.Thread:
    engine = docker.from_env()

    def watch():
        def find():
            found = engine.containers.list(all=True, filters={"name": f"pi-job-{job_id}"})
            return found[0] if found else None

        found = wait_for(find, timeout=90, what="the job container")
        seen.update(entry.split("=", 1) for entry in found.attrs["Config"]["Env"])

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


# --- the whole path ----------------------------------------------------------------------------------------------

def test_a_labelled_issue_runs_on_a_clone_of_the_default_branch_with_its_token(
    github, post_github, label_trigger, run_worker, settings
):
    job_id = deliver(post_github, "fj-e2e-1", "fake-agent:report fake-agent:sleep=2")
    seen: dict = {}
    watcher = container_env_while_running(job_id, seen)

    run_worker("pi-jobs", env_overrides={**github.env, "LEAK_CANARY": "from-the-worker"})
    joined(watcher, 100, "the container watcher")

    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.reason, run.attempt) == (Outcome.COMPLETED, "", 1)
    workspace = job_root(settings, job_id) / "workspace"
    assert git_head(workspace) == github.sha  # the default branch, at the commit the forge named
    assert (workspace / "app" / "main.py").read_text() == "print('web')\n"
    assert "fake pi output" in (workspace / "pi-output.md").read_text()  # the job user could write the clone
    # The repo's .pi/ was materialised into the read-only /job.
    skill = job_root(settings, job_id) / "job" / "pi" / "skills" / "fix-bug" / "SKILL.md"
    assert skill.read_text() == "# Fix a bug\n"
    # The job's token, under GitHub's usual names, and nothing else of the worker's environment.
    report = json.loads((workspace / "sandbox-report.json").read_text())
    names = set(report["env_names"].split()) - SHELL_OWN_ENV
    assert not names & FORGE_TOKEN_NAMES and names <= CONTAINER_ENV, names - CONTAINER_ENV  # the worker publishes
    assert not set(seen) & FORGE_TOKEN_NAMES and PAT not in str(seen)  # the container never held the token
    assert "LEAK_CANARY" not in seen and "GITHUB_WEBHOOK_SECRET" not in seen and "DATABASE_URL" not in seen
    # The worker published the agent's work with it: one draft pull request, and no status comment.
    (pull,) = github.pulls_of("github", "acme/web")
    run = Run.objects.get(job_id=job_id)
    assert (run.publish_outcome, run.pull_request, pull["head"]) == ("published", pull["number"], "pi/7-fix-bug")
    assert github.posted(COMMENTS) == []


def test_a_github_app_job_gets_a_fresh_repository_token_that_is_revoked_after(
    github, post_github, label_trigger, run_worker
):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    github.github_app("4242", "99", key.public_key(), account="acme", token="ghs_e2e")
    github.github_app_installed_on("acme-pi-forks", "100")  # where the deployment's forks are made
    # Only minted tokens reach git: the job's clones the origin, the fork's own pushes to the fork.
    github.serve_git(github.bare.parent.parent, (basic("x-access-token", "ghs_e2e-1"),
                                                 basic("x-access-token", "ghs_e2e-3")))
    job_id = deliver(post_github, "fj-e2e-app", "fake-agent:sleep=2")
    seen: dict = {}
    watcher = container_env_while_running(job_id, seen)

    run_worker("pi-jobs", env_overrides={"GITHUB_API_URL": github.url, "GITHUB_TOKEN": "", "GITHUB_APP_ID": "4242",
                                         "GITHUB_APP_INSTALLATION_ID": "99", "GITHUB_APP_PRIVATE_KEY": pem,
                                         "GITHUB_FORK_ORGANIZATION": "acme-pi-forks"})
    joined(watcher, 100, "the container watcher")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert github.minted == [
        {"token": "ghs_e2e-1", "installation": "99", "repositories": ["acme/web"],
         "permissions": {"contents": "write", "pull_requests": "write", "issues": "write"}},
        # The fork, made by the App's installation on the fork organization, and the push to it alone.
        {"token": "ghs_e2e-2", "installation": "100", "repositories": [],
         "permissions": {"administration": "write", "contents": "read"}},
        {"token": "ghs_e2e-3", "installation": "100", "repositories": ["acme-pi-forks/web"],
         "permissions": {"contents": "write"}}]
    assert not set(seen) & FORGE_TOKEN_NAMES and "ghs_e2e" not in str(seen)
    run = Run.objects.get(job_id=job_id)
    assert run.publish_outcome == "published"
    (pull,) = github.pulls_of("github", "acme/web")
    assert (pull["fork"], pull["head"], run.pull_request) == ("acme-pi-forks/web", "pi/7-fix-bug", pull["number"])
    pushes = [r for r in github.requests if r["path"].startswith("/git/acme-pi-forks/web.git")
              and r["method"] == "POST"]
    assert pushes and all(r["headers"]["authorization"] == basic("x-access-token", "ghs_e2e-3") for r in pushes)
    origin_api = [r for r in github.requests if r["path"].startswith("/repos/acme/web")
                  and not r["path"].endswith("/forks")]
    assert origin_api and all(r["headers"]["authorization"] == "Bearer ghs_e2e-1" for r in origin_api)
    # Every minted token is revoked by the end, the job's last.
    revoked = [r["headers"]["authorization"] for r in github.requests if r["method"] == "DELETE"]
    assert sorted(revoked) == ["Bearer ghs_e2e-1", "Bearer ghs_e2e-2", "Bearer ghs_e2e-3"]
    assert revoked[-1] == "Bearer ghs_e2e-1" and github.requests[-1]["method"] == "DELETE"


def test_job_folders_and_the_clone_are_removed_after_the_run_when_no_sandbox_keeps_them(
        github, post_github, label_trigger, run_worker, settings):
    job_id = deliver(post_github, "fj-e2e-rm")

    run_worker("pi-jobs", env_overrides={**github.env, "PI_KEEP_JOB_DIRS": "0", "PI_SANDBOX_RETENTION_HOURS": "0"})

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert any(r["path"].startswith("/git/") for r in github.requests)  # it did clone
    assert not job_root(settings, job_id).exists()


# --- refusals and retries, each with its comment ---------------------------------------------------------------

def refused(job_id: str, reason: str) -> Run:
    (run,) = Run.objects.filter(job_id=job_id)  # one attempt: a refusal is never retried
    assert (run.outcome, run.reason, run.budget_reserved, run.exit_code) == (Outcome.POLICY, reason, False, None)
    return run


def test_an_unprotected_default_branch_is_refused_before_any_clone(
    github, post_github, label_trigger, run_worker, redis_conn
):
    github.github_repository("acme/web", github.sha, protected=False)
    job_id = deliver(post_github, "fj-e2e-unprot")

    run_worker("pi-jobs", env_overrides=github.env)

    refused(job_id, "unprotected-branch")
    assert not any(r["path"].startswith("/git/") for r in github.requests)
    assert github.posted(COMMENTS) == [{"body": "Refused: the default branch is not protected. See SECURITY.md."}]
    assert not redis_conn.keys("budget:*")  # refused before any budget was counted


def test_a_commit_that_vanished_before_the_clone_is_sha_gone(github, post_github, label_trigger, run_worker):
    commit_files(github.bare, {"README.md": "history rewritten\n"})  # force-pushed after the API answered
    prune_unreachable(github.bare)
    job_id = deliver(post_github, "fj-e2e-gone")

    run_worker("pi-jobs", env_overrides=github.env)

    refused(job_id, "sha-gone")
    assert github.posted(COMMENTS) == [{"body": comments.REFUSED["sha-gone"]}]


def test_an_oversized_pi_folder_is_refused_naming_the_bound(github, post_github, label_trigger, run_worker):
    github.sha = commit_files(github.bare, {**FILES, **{f".pi/skills/s{i}/SKILL.md": "x" for i in range(257)}})
    github.github_repository("acme/web", github.sha)
    job_id = deliver(post_github, "fj-e2e-pi")

    run_worker("pi-jobs", env_overrides=github.env)

    refused(job_id, "pi-too-many-files")
    assert github.posted(COMMENTS) == [
        {"body": "Refused: the repository's .pi/ folder has more files than a job may carry. Not run."}]


def test_a_forge_401_is_a_configuration_refusal(github, post_github, label_trigger, run_worker):
    github.routes["/repos/acme/web"] = (401, {"message": "Bad credentials"})
    job_id = deliver(post_github, "fj-e2e-401")

    run_worker("pi-jobs", env_overrides=github.env)

    refused(job_id, "forge-auth-refused")
    assert github.posted(COMMENTS) == [{"body": comments.REFUSED["forge-auth-refused"]}]


def test_a_forge_500_is_retried_and_the_retry_runs(github, post_github, label_trigger, run_worker, redis_conn):
    answers = iter([(500, {"message": "Server Error"})])
    healthy = github.routes["/repos/acme/web"]
    github.routes["/repos/acme/web"] = lambda request: next(answers, healthy)
    job_id = deliver(post_github, "fj-e2e-500")

    run_worker("pi-jobs", env_overrides=github.env)
    first = Run.objects.get(job_id=job_id, attempt=1)
    assert (first.outcome, first.reason) == (Outcome.FAILED, "forge-unavailable")
    assert Queue("pi-jobs", connection=redis_conn).fetch_job(job_id).get_status() == "scheduled"
    assert github.posted(COMMENTS) == []  # a retried attempt says nothing

    wait_for(lambda: run_worker("pi-jobs", env_overrides=github.env)
             and Run.objects.filter(job_id=job_id, attempt=2).exists(),
             timeout=60, interval=0.5, what="the second attempt")
    assert Run.objects.get(job_id=job_id, attempt=2).outcome == Outcome.COMPLETED
    assert github.posted(COMMENTS) == []


def test_a_forge_that_stays_down_fails_once_with_one_comment(github, post_github, label_trigger, run_worker):
    github.routes["/repos/acme/web/branches/main"] = (502, {"message": "Bad Gateway"})
    job_id = deliver(post_github, "fj-e2e-502")

    run_worker("pi-jobs", env_overrides=github.env)
    assert github.posted() == []
    wait_for(lambda: run_worker("pi-jobs", env_overrides=github.env)
             and Run.objects.filter(job_id=job_id, attempt=2).exists(),
             timeout=60, interval=0.5, what="the second attempt")

    assert [(r.outcome, r.reason) for r in Run.objects.filter(job_id=job_id).order_by("attempt")] == [
        (Outcome.FAILED, "forge-unavailable")] * 2
    assert github.posted(COMMENTS) == [{"body": comments.FAILED_DEFAULT}]


def test_a_worker_with_an_incomplete_github_app_refuses_to_start(post_github, label_trigger, run_worker, redis_conn):
    job_id = deliver(post_github, "fj-e2e-noapp")

    result = run_worker("pi-jobs", env_overrides={"GITHUB_APP_ID": "4242"}, check=False)

    assert result.returncode != 0 and "worker.E001" in result.stderr
    assert "GITHUB_APP_INSTALLATION_ID" in result.stderr
    assert Queue("pi-jobs", connection=redis_conn).fetch_job(job_id).get_status() == "queued"  # nothing lost
    assert not Run.objects.filter(job_id=job_id).exists()


def test_no_other_local_user_can_read_the_prompt_or_the_clone(github, post_github, label_trigger, run_worker):
    """PI_JOB_ROOT in a folder anyone may pass through (as /srv/pi-jobs would be): each job's own folder is
    the worker's, 0700, while the container's user still reads its prompt and writes the clone."""
    jobs = Path(tempfile.mkdtemp(prefix="pidispatch-jobs-"))
    jobs.chmod(0o755)
    try:
        job_id = deliver(post_github, "fj-private", "fake-agent:report")

        run_worker("pi-jobs", env_overrides={**github.env, "PI_JOB_ROOT": str(jobs)})

        assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
        root = jobs / job_id
        assert (root.stat().st_mode & 0o777, root.stat().st_uid) == (0o700, os.geteuid())
        assert (root / "workspace" / "sandbox-report.json").exists()  # the runner read its prompt's directive
        someone_else = {"user": 4321, "group": 4321, "extra_groups": []}
        for path in (root / "job" / "prompt.md", root / "job" / "event.json", root / "workspace" / "README.md"):
            assert path.exists()
            read = subprocess.run(["cat", str(path)], capture_output=True, **someone_else)
            assert read.returncode != 0 and b"Permission denied" in read.stderr, path
    finally:
        shutil.rmtree(jobs, ignore_errors=True)
