"""A forge job's workspace bounded by the filesystem, not only by a watch that polls (issue 53 §2): where the host
allows it (a root worker with loop devices, as here), the workspace is an ext4 volume of PI_JOB_DISK_MB, so nine
`fallocate -l 3G` fail in the job instead of taking 27 GB of the host; a clone larger than the bound is refused
workspace-too-large, not retried; an over-limit folder is never kept (not for the sandbox, not for debugging);
the folders are unmounted before they are removed; doctor says which bound this host uses."""

import os
import subprocess

import pytest

from apps.worker.models import Outcome, Run
from apps.worker.sandbox import jobfiles, mounts, workspace_volume
from devtools.fake_forge import github_for_any_repository
from tests.jobspecs import enqueue_spec, forge_spec
from tests.receiver_support import STAND_IN_TOKEN

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/loop-control") or os.geteuid() != 0,
                                reason="loop devices and a root worker")

FILL = ("set -u\ncd /workspace\nfor n in 1 2 3 4 5 6 7 8 9; do\n"
        "  if fallocate -l 3G alloc-$n.bin 2>/dev/null; then echo made >> fallocate.txt; "
        "else rm -f alloc-$n.bin; echo refused >> fallocate.txt; fi\ndone\n")  # ext4 keeps what it could allocate
SMALL = {"PI_JOB_DISK_MB": "20", "PI_JOB_DISK_POLL_SECONDS": "0.2", "PI_JOB_TIMEOUT_SECONDS": "60"}


def job_folders(settings) -> list[str]:
    root = settings.PI_JOB_ROOT
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


@pytest.mark.django_db
def test_the_volume_refuses_what_fallocate_asks_past_the_bound_and_goes_with_its_folder(tmp_path, settings):
    settings.PI_JOB_ROOT = tmp_path / "jobs"
    settings.PI_JOB_DISK_MB, settings.PI_JOB_MAX_FILES = 20, 1000
    assert workspace_volume.method().name == "volume"
    dirs = jobfiles.prepare(forge_spec("gh-volume"), settings.PI_JOB_ROOT, owner=(1000, 1000))
    try:
        assert os.path.ismount(dirs.workspace) and os.listdir(dirs.workspace) == []
        assert os.stat(dirs.workspace).st_uid == 1000  # the job's user writes it
        refused = subprocess.run(["fallocate", "-l", "3G", str(dirs.workspace / "big.bin")], capture_output=True)
        assert refused.returncode != 0 and b"No space left" in refused.stderr
        (dirs.workspace / "big.bin").unlink(missing_ok=True)  # ext4 keeps what it could allocate
        with open(dirs.workspace / "fits.bin", "wb") as fits:  # the whole bound is there to use
            fits.write(b"\0" * (19 * 1024 * 1024))
        made = sum(_touched(dirs.workspace / f"f{n}") for n in range(1100))
        assert 1000 <= made < 1100, "the volume has about PI_JOB_MAX_FILES inodes"
        image = dirs.root / workspace_volume.IMAGE
        assert os.stat(image).st_blocks * 512 <= workspace_volume.image_bytes()
    finally:
        jobfiles.remove(dirs)
    assert not dirs.root.exists() and mounts.mounts_under(tmp_path) == []


def _touched(path) -> bool:
    try:
        path.touch()
    except OSError:
        return False
    return True


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_nine_fallocates_of_3g_fail_in_the_job_and_the_run_publishes_what_fits(tmp_path, run_worker, settings):
    forge = github_for_any_repository(tmp_path / "forge", STAND_IN_TOKEN, {"README.md": "hi\n", "fill.sh": FILL})
    try:
        enqueue_spec(forge_spec("gh-fallocate", body="fake-agent:run-script=fill.sh Fill the disk."))
        run_worker("pi-jobs", env_overrides={**SMALL, "GITHUB_API_URL": forge.url})
        run = Run.objects.get(job_id="gh-fallocate")
        assert run.outcome == Outcome.COMPLETED
        kept = settings.PI_JOB_ROOT / "gh-fallocate"  # the tests keep job folders (PI_KEEP_JOB_DIRS=1)
        assert (kept / "workspace" / "fallocate.txt").read_text() == "refused\n" * 9
        assert mounts.mounts_under(kept)  # still mounted while kept
    finally:
        forge.close()
        mounts.remove_tree(settings.PI_JOB_ROOT / "gh-fallocate")


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_an_over_limit_workspace_is_never_kept(tmp_path, run_worker, settings):
    """A sparse file past the bound (occupying no block, so the volume holds it): the watch stops the job; its
    folder goes at once, though job folders are kept for debugging and for the sandbox."""
    enqueue_spec(forge_spec("gh-over-kept", body="fake-agent:sparse-mb=4096"))
    run_worker("pi-jobs", env_overrides={**SMALL, "PI_KEEP_JOB_DIRS": "1", "PI_SANDBOX_RETENTION_HOURS": "24"})
    run = Run.objects.get(job_id="gh-over-kept")
    assert (run.outcome, run.reason) == (Outcome.POLICY, "workspace-too-large")
    assert "gh-over-kept" not in job_folders(settings) and mounts.mounts_under(settings.PI_JOB_ROOT) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_a_clone_larger_than_the_bound_is_refused_not_retried(tmp_path, run_worker, settings):
    forge = github_for_any_repository(tmp_path / "forge", STAND_IN_TOKEN,
                                      {"README.md": "hi\n", "big.txt": "y" * (30 * 1024 * 1024)})
    try:
        enqueue_spec(forge_spec("gh-clone-big"))
        run_worker("pi-jobs", env_overrides={**SMALL, "GITHUB_API_URL": forge.url})
        (run,) = Run.objects.filter(job_id="gh-clone-big")
        assert (run.outcome, run.reason) == (Outcome.POLICY, "workspace-too-large")
        assert "gh-clone-big" not in job_folders(settings)
    finally:
        forge.close()


def test_doctor_says_which_bound_this_host_uses(settings):
    from apps.worker import doctor

    (found,) = doctor.check_workspace_bound()
    assert found.status == doctor.OK and "ext4 volume of" in found.finding
    settings.PI_JOB_WORKSPACE_VOLUME = "off"
    (found,) = doctor.check_workspace_bound()
    assert found.status == doctor.WARN and "PI_JOB_WORKSPACE_VOLUME=off" in found.finding


def test_a_mistyped_volume_setting_fails_the_check(settings):
    from django.core.checks import run_checks

    settings.PI_JOB_WORKSPACE_VOLUME = "of"
    assert [message.id for message in run_checks() if message.id == "worker.E016"] == ["worker.E016"]
    settings.PI_JOB_WORKSPACE_VOLUME = "off"
    assert not [message for message in run_checks() if message.id == "worker.E016"]
