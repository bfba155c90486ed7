"""A job's folder (its prompt, with the issue text, and its clone) never outlives the work horse that held
it: the boot reaper and every worker's periodic sweep remove the folders under PI_JOB_ROOT that no live
process holds, unless a KEEP_UNTIL in it names a time still to come. Nothing that is not a job's own
folder is touched, least of all a local job's workspace, which is the operator's folder."""

import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from apps.worker.sandbox import container, jobfiles
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec, local_spec, marked_spec
from tests.process_support import group_alive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

HOST = {"PI_WORKER_NAME": "hostA", "PI_KEEP_JOB_DIRS": "0"}
QUEUES = ("pi-jobs", "pi-jobs@hostA")


def prepared_in_a_process(job_id, root, *, stays=False, keep_until=None) -> int:
    """The job's folder as a work horse prepares it, in a child process that then exits (or stays, holding it).
    A KEEP_UNTIL is written while the child still holds the folder: a sweep may run the moment it lets go."""
    pid = os.fork()
    if pid == 0:
        try:
            jobfiles.prepare(forge_spec(job_id), root, owner=container.job_user())
            if keep_until is not None:
                (root / job_id / "KEEP_UNTIL").write_text(keep_until)
            while stays:
                time.sleep(1)
        finally:
            os._exit(0)
    if not stays:
        os.waitpid(pid, 0)
    return pid


def test_the_sweep_removes_job_folders_no_live_process_holds_and_keeps_the_rest(start_worker, fast_fleet, settings,
                                                                                tmp_path):
    worker = start_worker(*QUEUES, env=HOST)
    wait_for(lambda: "Listening on" in worker.output(), timeout=60, what="the worker to take work")
    root = settings.PI_JOB_ROOT
    now = datetime.now(UTC)
    prepared_in_a_process("gh-abandoned", root)
    prepared_in_a_process("gh-kept", root, keep_until=(now + timedelta(hours=1)).isoformat())
    prepared_in_a_process("gh-expired", root, keep_until=(now - timedelta(minutes=1)).isoformat())
    prepared_in_a_process("gh-garbled", root, keep_until="tomorrow-ish")
    prepared_in_a_process("gh-naive", root, keep_until=(now + timedelta(hours=1)).replace(tzinfo=None).isoformat())
    holder = prepared_in_a_process("gh-held", root, stays=True)
    wait_for(lambda: (root / "gh-held" / "job" / "prompt.md").exists(), timeout=10, what="the live holder")
    # Not job folders of ours: an operator's repository, a link out of the root, a folder with a foreign holder.
    (root / "myrepo" / ".git").mkdir(parents=True)
    (root / "myrepo" / ".pidispatch-holder").write_text("myrepo-but-not-ours")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("mine")
    (root / "linked").symlink_to(outside)

    try:
        wait_for(lambda: not (root / "gh-abandoned").exists() and not (root / "gh-expired").exists(), timeout=20,
                 what="the sweep to remove the unheld folders")
        time.sleep(1.5)  # a few more sweeps
        assert sorted(path.name for path in root.iterdir()) == [
            "gh-garbled", "gh-held", "gh-kept", "gh-naive", "linked", "myrepo"]
        assert (outside / "precious").read_text() == "mine" and (root / "myrepo" / ".git").is_dir()
        assert worker.output().count("job_folder_kept job=gh-garbled why=keep-until-unreadable") == 1
        assert "job_folder_reaped job=gh-abandoned" in worker.output()
    finally:
        os.kill(holder, 9)
        os.waitpid(holder, 0)

    wait_for(lambda: not (root / "gh-held").exists(), timeout=20, what="the folder its holder no longer holds")


def test_a_killed_workers_job_folders_go_at_the_next_boot_and_a_local_jobs_own_folder_stays(
        start_worker, fast_fleet, job_containers, settings, repo):  # noqa: F811
    host = {**HOST, "PI_LOST_RETRIES": "0"}  # a lost job run again would prepare its folder anew
    first = start_worker(*QUEUES, env=host, name="first")
    enqueue_spec(marked_spec("gh-orphan-folder", body="fake-agent:sleep=60"), "pi-jobs@hostA")
    enqueue_spec(local_spec("run-orphan-folder", str(repo), task="fake-agent:sleep=60"), "pi-jobs@hostA")
    forge_folder, local_folder = settings.PI_JOB_ROOT / "gh-orphan-folder", settings.PI_JOB_ROOT / "run-orphan-folder"
    wait_for(lambda: "gh-orphan-folder" in job_containers("hostA"), timeout=90, what="the forge job's container")
    assert (forge_folder / "job" / "prompt.md").exists() and (forge_folder / "workspace" / ".git").is_dir()

    first.kill()
    wait_for(lambda: not group_alive(first.pid), timeout=30, what="its scheduler and horse to die with it")
    assert forge_folder.exists()  # nothing of the dead worker removes it
    second = start_worker(*QUEUES, env=host, name="second")
    wait_for(lambda: "run-orphan-folder" in job_containers("hostA"), timeout=90, what="the local job's container")
    second.kill()
    wait_for(lambda: not group_alive(second.pid), timeout=30, what="the second worker to die")
    assert (local_folder / "job" / "prompt.md").exists()

    start_worker(*QUEUES, env=host, name="third")

    wait_for(lambda: not forge_folder.exists() and not local_folder.exists(), timeout=60, what="the boot reaper")
    assert (repo / "README.md").read_text() == "hello\n" and (repo / ".git").is_dir()
