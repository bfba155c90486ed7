"""Folders that may hold mounts (a job's workspace volume, an image build's proc) are unmounted before they are
removed, and never walked into while a mount is left: a removal that follows a mount deletes what the mount shows."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

logger = logging.getLogger("pidispatch.worker")

UMOUNT = shutil.which("umount") or "umount"
_ESCAPED = re.compile(r"\\([0-7]{3})")  # /proc/self/mountinfo writes a space as \040


def mounts_under(folder: Path) -> list[str]:
    """The mount points inside `folder` (not `folder` itself), as this process's mount namespace sees them."""
    prefix = str(Path(folder).resolve()) + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        points = [_ESCAPED.sub(lambda match: chr(int(match.group(1), 8)), line.split()[4]) for line in mountinfo]
    return [point for point in points if point.startswith(prefix) or point == prefix[:-1]]


def unmount_under(folder: Path) -> list[str]:
    """Unmount everything at or inside `folder`, deepest first and lazily (a container that still holds one keeps
    its own view until it ends); what is still mounted after."""
    for point in sorted(mounts_under(folder), key=len, reverse=True):
        subprocess.run([UMOUNT, "--lazy", point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return mounts_under(folder)


def remove_tree(folder: Path) -> bool:
    """`folder` removed, its mounts first; False (and the folder left, said in the log) when a mount stays."""
    left = unmount_under(folder)
    if left:
        logger.error("folder_kept_mounted folder=%s mounts=%d why=unmount-failed", folder, len(left))
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True
