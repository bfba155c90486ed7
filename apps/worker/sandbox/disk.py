"""What a job may take of the worker host's disk (security review #14, item 10).

A job's workspace is a bind mount, which no engine's storage quota covers (those apply to the container's
own layer, which is read-only: apps/worker/sandbox/container.py), so the worker measures it: before the container
starts, every PI_JOB_DISK_POLL_SECONDS while it runs, and once more when it has ended (a burst between two
samples). A workspace past PI_JOB_DISK_MB or PI_JOB_MAX_FILES stops the job `workspace-too-large` (a policy end,
never retried), before anything of it is collected or published. A forge job's workspace is its clone, counted
whole; a local job's is the operator's folder, of which only what the job added counts.

What counts is what the files say they hold (their apparent size, as `git add` reads and a push sends them: a
sparse file of 4 GiB is 4 GiB, though it occupies no block) and how many entries there are (200,000 empty files
occupy nothing, yet each costs git and the host an inode and a walk). A file with several links counts its bytes
once; links are never followed.

A full disk (ENOSPC, or a quota's EDQUOT) while a job is prepared is an infrastructure fault, retried like
any other (`disk-full`), never the worker's own bug. PI_JOB_ROOT is best a filesystem of its own, so that a
job can never fill the one the database lives on.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

logger = logging.getLogger("pidispatch.worker")

MIB = 1024 * 1024
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# A walk of a big tree is not free: the watch waits at least this many times as long as its last walk took.
WALK_SHARE = 4


def is_full(error: OSError) -> bool:
    return error.errno in FULL_ERRNOS


@dataclass(frozen=True)
class Usage:
    bytes: float = 0
    files: float = 0  # entries: files, folders, links

    def past(self, most: Usage) -> bool:
        return self.bytes > most.bytes or self.files > most.files


NO_LIMIT = Usage(math.inf, math.inf)


def usage(folder: Path, *, ours: bool = False, most: Usage = NO_LIMIT) -> Usage:
    """The apparent size of the tree under `folder` and how many entries it holds. Entries that vanish or cannot
    be read while it is walked are skipped (the job is still writing). The walk stops as soon as the count is
    past `most` (the answer then says only that). In a tree that is `ours` (a forge job's clone), a folder the
    job locked itself out of is opened up first when this worker owns it (a non-root worker runs its jobs as
    itself), so that no job hides what it wrote behind a chmod; an operator's folder is only read."""
    total, files, seen, pending = 0, 0, set(), [os.fspath(folder)]
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
        files += len(entries)
        for entry in entries:
            try:
                status = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(status.st_mode):
                pending.append(entry.path)
                continue
            if status.st_nlink > 1:
                if (status.st_dev, status.st_ino) in seen:
                    continue
                seen.add((status.st_dev, status.st_ino))
            total += status.st_size
        if Usage(total, files).past(most):
            break
    return Usage(total, files)


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
    """One job's workspace against PI_JOB_DISK_MB and PI_JOB_MAX_FILES (0: no limit), from before its container
    starts until it ends. Past either it calls `on_exceeded` once (which stops the container) and says so in
    `exceeded`; `over_limit()` measures once more (after the container, for what it wrote since the last sample)."""

    def __init__(self, job_id: str, workspace: Path, *, counts_whole: bool, on_exceeded: Callable[[], None]):
        self.job_id, self.workspace, self.on_exceeded = job_id, workspace, on_exceeded
        self.limit = Usage(settings.PI_JOB_DISK_MB * MIB or math.inf, settings.PI_JOB_MAX_FILES or math.inf)
        self.active = self.limit != NO_LIMIT
        self.counts_whole = counts_whole
        self.baseline = Usage() if counts_whole or not self.active else usage(workspace)
        self.exceeded = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def over_limit(self) -> bool:
        if not self.active:
            return False
        most = Usage(self.baseline.bytes + self.limit.bytes, self.baseline.files + self.limit.files)
        found = usage(self.workspace, ours=self.counts_whole, most=most)
        if not found.past(most):
            return False
        logger.warning("workspace_too_large job=%s mb_at_least=%d files_at_least=%d limit_mb=%d limit_files=%d",
                       self.job_id, (found.bytes - self.baseline.bytes) // MIB, found.files - self.baseline.files,
                       settings.PI_JOB_DISK_MB, settings.PI_JOB_MAX_FILES)
        return True

    def start(self) -> None:
        if self.active:
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
