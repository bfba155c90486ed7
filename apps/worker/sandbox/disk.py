"""What a job may take of the worker host's disk (security review #14, item 10).

A job's workspace is a bind mount, which no engine's storage quota covers (those apply to the container's
own layer), so the worker measures it: before the container starts and every PI_JOB_DISK_POLL_SECONDS while
it runs. A workspace past PI_JOB_DISK_MB stops the job `workspace-too-large` (a policy end, never retried).
A forge job's workspace is its clone, counted whole; a local job's is the operator's folder, of which only
what the job added counts. Disk usage is what the files really occupy (allocated blocks, a file with several
links once), found without following links.

A full disk (ENOSPC, or a quota's EDQUOT) while a job is prepared is an infrastructure fault, retried like
any other (`disk-full`), never the worker's own bug. PI_JOB_ROOT is best a filesystem of its own, so that a
job can never fill the one the database lives on.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

logger = logging.getLogger("pidispatch.worker")

MIB = 1024 * 1024
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# A walk of a big tree is not free: the watch waits at least this many times as long as its last walk took.
WALK_SHARE = 4


def is_full(error: OSError) -> bool:
    return error.errno in FULL_ERRNOS


def usage_bytes(folder: Path, *, ours: bool = False) -> int:
    """The bytes the tree under `folder` occupies on disk. Entries that vanish or cannot be read while it is
    walked are skipped (the job is still writing). In a tree that is `ours` (a forge job's clone), a folder
    the job locked itself out of is opened up first when this worker owns it (a non-root worker runs its
    jobs as itself), so that no job hides what it wrote behind a chmod; an operator's folder is only read."""
    total, seen, pending = 0, set(), [os.fspath(folder)]
    while pending:
        path = pending.pop()
        try:
            entries = list(os.scandir(path))
        except PermissionError:
            if not (ours and _open_up(path)):
                continue
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
        except OSError:
            continue
        for entry in entries:
            try:
                status = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if status.st_nlink > 1:
                if (status.st_dev, status.st_ino) in seen:
                    continue
                seen.add((status.st_dev, status.st_ino))
            total += status.st_blocks * 512
            if stat.S_ISDIR(status.st_mode):
                pending.append(entry.path)
    return total


def _open_up(path: str) -> bool:
    """Give this worker's own folder back its owner's rights (never through a link). False when it cannot."""
    try:
        status = os.lstat(path)
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            return False
        os.chmod(path, stat.S_IMODE(status.st_mode) | stat.S_IRWXU)
    except OSError:
        return False
    return True


class WorkspaceWatch:
    """One job's workspace against PI_JOB_DISK_MB (0: no limit), from before its container starts until it
    ends. Past the limit it calls `on_exceeded` once (which stops the container) and says so in `exceeded`."""

    def __init__(self, job_id: str, workspace: Path, *, counts_whole: bool, on_exceeded: Callable[[], None]):
        self.job_id, self.workspace, self.on_exceeded = job_id, workspace, on_exceeded
        self.limit = settings.PI_JOB_DISK_MB * MIB
        self.counts_whole = counts_whole
        self.baseline = 0 if counts_whole or not self.limit else usage_bytes(workspace)
        self.exceeded = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def over_limit(self) -> bool:
        if not self.limit:
            return False
        added = usage_bytes(self.workspace, ours=self.counts_whole) - self.baseline
        if added <= self.limit:
            return False
        logger.warning("workspace_too_large job=%s mb=%d limit_mb=%d", self.job_id, added // MIB,
                       settings.PI_JOB_DISK_MB)
        return True

    def start(self) -> None:
        if self.limit:
            self._thread = threading.Thread(target=self._watch, name=f"disk-{self.job_id}", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        pause = settings.PI_JOB_DISK_POLL_SECONDS
        while not self._stop.wait(pause):
            started = time.monotonic()
            if self.over_limit():
                self.exceeded = True
                self.on_exceeded()
                return
            pause = max(settings.PI_JOB_DISK_POLL_SECONDS, (time.monotonic() - started) * WALK_SHARE)
