"""A job image build stopped mid-way (Ctrl-C, SIGTERM) stops at once and leaves nothing behind: its step's whole
process group ends, the proc mount debootstrap made in its target is unmounted and its folder removed; a folder an
earlier, killed build left (its mount too) is removed by the next build, which never walks into a mount."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from devtools import jobimage
from devtools.services import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting proc needs root")

# debootstrap's part: it mounts proc in its target, starts a child of its own and keeps working.
FAKE_DEBOOTSTRAP = textwrap.dedent("""\
    #!/bin/sh
    target="$4"
    mkdir -p "$target/proc"
    mount -t proc proc "$target/proc"
    sleep 300 &
    echo $! > "{state}/child.pid"
    touch "{state}/mounted"
    wait
""")

# The build as `make image` runs it, with the fake debootstrap and a cache folder of the test's.
BUILD = textwrap.dedent("""\
    import shutil, sys
    from pathlib import Path
    from devtools import jobimage, services, stack

    cache, debootstrap = Path(sys.argv[1]), sys.argv[2]
    jobimage.CACHE_DIR = cache
    services.ensure_package = lambda name, package: debootstrap if name == "debootstrap" else shutil.which(name)
    stack.StopSignals().install()
    try:
        with jobimage._build_lock():
            jobimage._make_rootfs_tar(cache / "rootfs-test.tar")
    except stack.Stop:
        sys.exit(143)
""")


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear within {seconds} s"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")")[-1].split()[0] != "Z"


def test_a_build_stopped_during_debootstrap_ends_its_processes_unmounts_and_removes_its_folder(tmp_path):
    cache, state = tmp_path / "image-cache", tmp_path / "state"
    cache.mkdir()
    state.mkdir()
    debootstrap = tmp_path / "debootstrap"
    debootstrap.write_text(FAKE_DEBOOTSTRAP.format(state=state))
    debootstrap.chmod(0o755)
    build = subprocess.Popen([sys.executable, "-c", BUILD, str(cache), str(debootstrap)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(state / "mounted", 30)
        assert jobimage.mounts_under(cache), "the fake debootstrap mounted proc in the build's target"
        stopped_at = time.monotonic()
        build.send_signal(signal.SIGTERM)
        output, _ = build.communicate(timeout=jobimage.STEP_STOP_SECONDS + 10)
    finally:
        if build.poll() is None:
            build.kill()
    assert build.returncode == 143, output
    assert time.monotonic() - stopped_at < jobimage.STEP_STOP_SECONDS + 3, "a stop acts within seconds"
    assert not alive(int((state / "child.pid").read_text())), "debootstrap's own child ended with the step"
    assert jobimage.mounts_under(cache) == []
    assert list(cache.glob(f"{jobimage.BUILD_PREFIX}*")) == [] and not (cache / "rootfs-test.tar").exists()


def test_the_next_build_removes_what_a_killed_build_left_mount_and_all(tmp_path, monkeypatch):
    monkeypatch.setattr(jobimage, "CACHE_DIR", tmp_path)
    left = tmp_path / f"{jobimage.BUILD_PREFIX}killed" / "rootfs"
    (left / "proc").mkdir(parents=True)
    (left / "etc").mkdir()
    (left / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    subprocess.run(["mount", "-t", "proc", "proc", str(left / "proc")], check=True)
    (tmp_path / "rootfs-old.partial").write_bytes(b"half a tar")
    try:
        with jobimage._build_lock():
            jobimage._sweep_interrupted_builds()
    finally:
        if jobimage.mounts_under(tmp_path):
            subprocess.run(["umount", "--lazy", str(left / "proc")], check=False)
    assert jobimage.mounts_under(tmp_path) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["build.lock"]
