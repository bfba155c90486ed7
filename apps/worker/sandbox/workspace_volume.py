"""A forge job's workspace as a filesystem of the job's own size: the disk bound the kernel keeps.

The watch (disk.py) measures the workspace every few seconds; between two samples a job can write far past its
bound (nine `fallocate -l 3G` left 28 GB on the host under PI_JOB_DISK_MB=100). Where the host allows it, a forge
job's workspace is an ext4 filesystem in a sparse image in the job's folder, loop-mounted on the workspace
(nosuid, nodev): PI_JOB_DISK_MB of space and PI_JOB_MAX_FILES inodes, so a write past either fails in the job
(ENOSPC) however fast it comes, and the host never holds more than the image. The watch stays: it counts what
files say they hold (a sparse file's apparent size, which `git add` would read) and stops the job.

PI_JOB_WORKSPACE_VOLUME: `auto` makes a volume where the host can (a root worker, loop devices, mkfs.ext4), the
watch alone bounds the workspace otherwise, which `doctor` warns of; `off`: the watch alone. A local job's
workspace is the operator's own folder: the watch alone bounds it. Folders holding a volume are removed through
mounts.remove_tree (unmounted first).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from apps.worker.sandbox.mounts import unmount_under

logger = logging.getLogger("pidispatch.worker")

CHOICES = ("auto", "off")  # PI_JOB_WORKSPACE_VOLUME
IMAGE = "workspace.img"  # beside the workspace, in the job's folder
MKFS = shutil.which("mkfs.ext4") or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin")
MOUNT = shutil.which("mount") or shutil.which("mount", path="/usr/bin:/bin")
MIB = 1024 * 1024
INODE_BYTES = 256  # ext4's inode size: the inode table is part of the image
FULL_BYTES = 64 * 1024  # less free space than this: the volume is full


@dataclass(frozen=True)
class Method:
    name: str  # "volume": a loop-mounted ext4 image per forge job; "watch": the watch alone
    why: str  # for doctor and the log: what the host allows, or why not


def method() -> Method:
    if settings.PI_JOB_WORKSPACE_VOLUME == "off":
        return Method("watch", "PI_JOB_WORKSPACE_VOLUME=off")
    if not settings.PI_JOB_DISK_MB:
        return Method("watch", "PI_JOB_DISK_MB=0 sets no disk bound")
    if os.geteuid() != 0:
        return Method("watch", "the worker is not root, and only root makes loop mounts")
    if not os.path.exists("/dev/loop-control"):
        return Method("watch", "this host has no loop devices (/dev/loop-control)")
    if not MKFS or not MOUNT:
        return Method("watch", "mkfs.ext4 (e2fsprogs) or mount (util-linux) is missing")
    return Method("volume", f"each forge job's workspace is an ext4 volume of {settings.PI_JOB_DISK_MB} MB"
                            + (f" and {settings.PI_JOB_MAX_FILES} files" if settings.PI_JOB_MAX_FILES else ""))


def image_bytes() -> int:
    """The image's size: the bound's bytes, the inode table for its files, and ext4's own metadata."""
    data = settings.PI_JOB_DISK_MB * MIB
    return data + _inodes() * INODE_BYTES + data // 16 + 4 * MIB


def _inodes() -> int:
    return settings.PI_JOB_MAX_FILES + 16 if settings.PI_JOB_MAX_FILES else max(1024, settings.PI_JOB_DISK_MB * 64)


def make(workspace: Path, owner: tuple[int, int]) -> bool:
    """Mount a fresh volume on the (empty) workspace folder, its root owned by `owner`; False when this host uses
    the watch alone, or the volume could not be made (said in the log: the watch still bounds the job)."""
    if method().name != "volume":
        return False
    image = workspace.parent / IMAGE
    try:
        with open(image, "xb") as sparse:
            sparse.truncate(image_bytes())
        image.chmod(0o600)
        _run([MKFS, "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode", "-N", str(_inodes()),
              "-E", f"root_owner={owner[0]}:{owner[1]}", str(image)])
        _run([MOUNT, "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image), str(workspace)])
        (workspace / "lost+found").rmdir()
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("workspace_volume_unavailable folder=%s error=%s", workspace.parent.name, type(error).__name__)
        unmount_under(workspace)
        image.unlink(missing_ok=True)
        return False
    return True


def is_full(workspace: Path) -> bool:
    """The workspace is a volume with no room left (space or files): what a failed clone into it means."""
    if not os.path.ismount(workspace):
        return False
    found = os.statvfs(workspace)
    return found.f_bavail * found.f_frsize < FULL_BYTES or found.f_favail == 0


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=60)
