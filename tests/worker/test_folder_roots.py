"""A folder run works only under a root its host declares in the environment (PI_LOCAL_ROOTS), never in the
deployment's own files, and never through a link out of a root: refused `folder-not-allowed` by the workspace gate
of every local job (a hand-started run, a trigger's, a cron schedule's), with the path and its owner in the worker's
log only. Real folders and git repositories; a real worker for the trigger's schedule."""

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run
from apps.worker.sandbox.workspace import WorkspaceRefused, check_local_folder
from tests.conftest import ROOT
from tests.local_repos import OWNER, committed_repository


def owned(folder: Path) -> Path:
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *OWNER)
    return folder


@pytest.fixture
def outside_root():
    """A folder no declared root holds, as a copy of a checkout somewhere else on the host would be."""
    base = Path(tempfile.mkdtemp(prefix="pidispatch-outside-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def stray_repo(outside_root):
    """A committed repository of an ordinary user, holding what a deployment's checkout would."""
    folder = committed_repository(outside_root / "copy-of-pidispatch")
    (folder / ".env").write_text("DJANGO_SECRET_KEY=not-for-the-agent\n")
    return owned(folder)


def refusal(folder) -> WorkspaceRefused:
    with pytest.raises(WorkspaceRefused) as refused:
        check_local_folder(str(folder), force=True)
    return refused.value


def test_a_repository_under_a_declared_root_is_the_workspace(repo):
    workspace = check_local_folder(str(repo), force=False)
    assert workspace.folder == Path(os.path.realpath(repo)) and workspace.owner == OWNER


def test_a_repository_outside_every_root_is_refused_and_only_the_log_says_where(stray_repo, caplog):
    caplog.set_level(logging.INFO, logger="pidispatch.workspace")

    refused = refusal(stray_repo)

    assert refused.reason == "folder-not-allowed"
    assert str(stray_repo) not in refused.hint and "1234" not in refused.hint
    (line,) = [record.getMessage() for record in caplog.records if "folder_not_allowed" in record.getMessage()]
    assert f"folder='{stray_repo}'" in line and "owner=1234" in line and "why=outside-roots" in line


def test_no_root_declared_is_no_folder_run_on_this_host(repo, settings):
    settings.PI_LOCAL_ROOTS = ()
    refused = refusal(repo)
    assert refused.reason == "folder-not-allowed" and "declares no folder roots" in refused.hint


def test_a_relative_root_holds_nothing(repo, settings):
    settings.PI_LOCAL_ROOTS = (os.path.relpath(repo.parent),)
    assert refusal(repo).reason == "folder-not-allowed"


@pytest.mark.parametrize("where", ["checkout", "inside the checkout", "var", "inside var", "job root",
                                   "inside the job root", "holding the checkout", "holding the job root"])
def test_the_deployments_own_files_are_refused_whatever_the_roots_say(settings, tmp_path, where):
    settings.PI_LOCAL_ROOTS = ("/",)  # everything is under a root
    job_root = Path(settings.PI_JOB_ROOT)
    job_root.mkdir(parents=True, exist_ok=True)
    folder = {"checkout": settings.BASE_DIR, "inside the checkout": settings.BASE_DIR / "apps",
              "var": settings.VAR_DIR, "inside var": settings.VAR_DIR / "anything",
              "job root": job_root, "inside the job root": job_root / "gh-1" / "workspace",
              "holding the checkout": settings.BASE_DIR.parent, "holding the job root": tmp_path}[where]

    refused = refusal(folder)

    assert refused.reason == "folder-not-allowed" and "pidispatch's own files" in refused.hint


def test_a_root_that_is_the_deployments_own_folder_still_refuses_it(settings):
    settings.PI_LOCAL_ROOTS = (str(settings.VAR_DIR),)
    assert refusal(settings.VAR_DIR).reason == "folder-not-allowed"


def test_a_link_under_a_root_is_judged_where_it_points(owner_space, repo, stray_repo):
    escaping = owner_space / "escaping"
    escaping.symlink_to(stray_repo)
    assert refusal(escaping).reason == "folder-not-allowed"

    staying = owner_space / "staying"
    staying.symlink_to(repo)
    assert check_local_folder(str(staying), force=False).folder == Path(os.path.realpath(repo))  # what is mounted


def test_a_missing_folder_outside_the_roots_is_refused_the_same_as_an_existing_one(outside_root, stray_repo):
    """Whoever asks cannot tell which host paths exist: outside the roots nothing is looked at."""
    assert refusal(outside_root / "no-such-folder").reason == refusal(stray_repo).reason == "folder-not-allowed"


def test_a_root_declared_in_the_env_file_is_not_a_root(tmp_path):
    """`.env` is a file a folder run might rewrite: settings read the roots from the real environment only."""
    probe = ("import os, sys; sys.path.insert(0, os.getcwd()); import environ; "
             "environ.Env.read_env = staticmethod(lambda *a, **k: os.environ.setdefault('PI_LOCAL_ROOTS', '/srv')); "
             "os.environ['DJANGO_SETTINGS_MODULE'] = 'pidispatch_site.settings'; "
             "from django.conf import settings; print(repr(settings.PI_LOCAL_ROOTS), os.environ.get('PI_LOCAL_ROOTS'))")
    env = {key: value for key, value in os.environ.items() if key != "PI_LOCAL_ROOTS"}
    without = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True).stdout.split()
    assert without == ["()", "None"]  # what `.env` said is neither a root nor passed on to what the process starts
    declared = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "PI_LOCAL_ROOTS": "/a, /b"},
                              capture_output=True, text=True, check=True).stdout
    assert declared.startswith("('/a', '/b')")


@pytest.mark.django_db(transaction=True)
def test_a_schedules_folder_outside_the_roots_is_refused_by_the_worker(stray_repo, worker_env, run_worker):
    trigger = Trigger.objects.create(position=0, on_type="cron", cron_id="nightly", cron_pattern="* * * * * *",
                                     kind="local", folder=str(stray_repo), flow="tidy", task="Tidy up.")
    env = {**worker_env, "PI_WORKER_NAME": "hostA"}
    command = [sys.executable, "manage.py", "run_cron", "--once"]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)  # first sight
    time.sleep(1.2)
    assert subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True,
                          text=True).stdout.startswith(f"fired cron-{trigger.pk}-")

    worker = run_worker("pi-jobs", "pi-jobs@hostA", env_overrides={"PI_WORKER_NAME": "hostA"})

    run = Run.objects.get(trigger=trigger)
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "folder-not-allowed", False)
    assert str(stray_repo) not in str(Run.objects.filter(pk=run.pk).values().get())  # the record: no path
    assert not (stray_repo / "pi-output.md").exists()  # no agent ran there
    assert f"folder_not_allowed folder='{stray_repo}' owner=1234 why=outside-roots" in worker.stderr + worker.stdout


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_host_declares_no_root_runs_no_folder(repo, run_worker):
    from tests.jobspecs import enqueue_spec, local_spec

    job_id = enqueue_spec(local_spec("run-no-roots", str(repo)))

    worker = run_worker("pi-jobs", env_overrides={"PI_LOCAL_ROOTS": ""})

    assert Run.objects.get(job_id=job_id).reason == "folder-not-allowed"
    assert "why=no-roots" in worker.stderr + worker.stdout
    assert not (repo / "pi-output.md").exists()
