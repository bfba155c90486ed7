"""What the agent changed, as the run page shows it: the paths with their added and removed lines, the commits, and
the diff, bounded, beside the summary that was posted on the forge.

Read from the worker's own publish repository (work.py's `store`) at publish time: its head is the very commit that
was pushed to the published branch (the same ids the forge now serves), or the one bundled in the kept work when
publishing failed, so no second fetch from the forge is needed. It is code, not issue text, but the agent wrote it:
scrubbed of the deployment's credentials and the job's secrets, as what is posted is; at most PI_RUN_DIFF_MAX_BYTES
of diff (the files with the fewest changed lines first, then cut); kept as long as run logs
(PI_JOB_LOG_RETENTION_DAYS, the workers' sweep), whether logs are captured or not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from apps.worker.forges.publishing.work import UNCOMMITTED_MESSAGE, Work, WorkUnreadable, git
from apps.worker.scrubbing import Scrubber

logger = logging.getLogger("pidispatch.publish")

MAX_FILES = 1000  # listed paths (the count says how many there were)
MAX_COMMITS = 100
DIFF_PATHS = 500  # paths one `git diff` is asked for (an argv of bounded length)
BYTES_PER_LINE = 16  # how much diff text a changed line is guessed to take, to choose the paths before reading
# How the diff's commits stand on the forge.
PUSHED, KEPT, NOT_PUBLISHED = "pushed", "kept", "not-published"


@dataclass(frozen=True)
class WorkChanges:
    files: list[dict] = field(default_factory=list)  # {"path", "added", "removed"} (None, None for a binary file)
    files_total: int = 0
    commits: list[dict] = field(default_factory=list)  # {"sha", "subject"}, oldest first
    commits_total: int = 0
    diff: str = ""
    diff_bytes: int = 0  # the chosen paths' diff before it was cut
    truncated: bool = False  # paths left out of the diff, or the diff cut
    source: str = NOT_PUBLISHED
    summary: str = ""  # what was posted on the forge (the pull request's or comment's summary), else blank

    def published(self, outcome: str, summary: str, kept: bool) -> WorkChanges:
        posted = outcome in ("published", "commented")
        return replace(self, source=PUSHED if outcome == "published" else KEPT if kept else NOT_PUBLISHED,
                       summary=summary if posted else "")


def _clean(text: str, scrubber: Scrubber) -> str:
    return scrubber.scrub(text).replace("\x00", "\ufffd")


def describe(work: Work, secrets, worker_subject: str = "") -> WorkChanges | None:
    """The work's paths, commits and bounded diff; None when git could not read them (the run is not failed for
    it: the page then says nothing was kept). The worker's own commit of what the agent left uncommitted is
    subjected with the target's title on the forge (`worker_subject`): the record names it by what it is instead,
    so no issue title is kept with the run."""
    if work.empty:
        return WorkChanges()
    scrubber = Scrubber(secrets)
    limit = settings.PI_RUN_DIFF_MAX_BYTES
    try:
        numstat = git(work.store, "diff", "--numstat", "-z", "--no-renames", "--no-ext-diff", "--no-textconv",
                      work.start, work.head).stdout
        files = []
        for entry in numstat.split("\0"):
            if not entry:
                continue
            added, removed, path = entry.split("\t", 2)
            files.append({"path": path, "added": int(added) if added.isdigit() else None,
                          "removed": int(removed) if removed.isdigit() else None})
        log = git(work.store, "log", "--format=%H%x1f%s%x1e", "--reverse", f"{work.start}..{work.head}").stdout
        commits = [{"sha": sha.strip(), "subject": UNCOMMITTED_MESSAGE if worker_subject and
                    subject == worker_subject else subject} for sha, _, subject in
                   (record.partition("\x1f") for record in log.split("\x1e")) if sha.strip()]
        # The smallest changes first, while their guessed size fits: one huge file never hides the rest.
        chosen, budget = [], limit
        for entry in sorted(files, key=lambda entry: (entry["added"] or 0) + (entry["removed"] or 0)):
            size = ((entry["added"] or 0) + (entry["removed"] or 0) + 4) * BYTES_PER_LINE
            if size > budget or len(chosen) >= DIFF_PATHS:
                break
            chosen.append(entry["path"])
            budget -= size
        chosen_set = set(chosen)
        diff = ""
        if chosen:
            ordered = [entry["path"] for entry in files if entry["path"] in chosen_set]  # git's own order
            diff = git(work.store, "--literal-pathspecs", "diff", "--no-color", "--no-ext-diff", "--no-textconv",
                       "--no-renames", work.start, work.head, "--", *ordered).stdout
    except (WorkUnreadable, ValueError):
        logger.warning("work_changes_unreadable store=%s", work.store.name)
        return None
    raw = diff.encode()
    truncated = len(chosen) < len(files) or len(raw) > limit
    text = raw[:limit].decode(errors="ignore")
    return WorkChanges(
        files=[{**entry, "path": _clean(entry["path"], scrubber)} for entry in files[:MAX_FILES]],
        files_total=len(files),
        commits=[{"sha": commit["sha"], "subject": _clean(commit["subject"], scrubber)}
                 for commit in commits[-MAX_COMMITS:]],
        commits_total=len(commits),
        diff=_clean(text, scrubber), diff_bytes=len(raw), truncated=truncated)


# --- kept with the run record --------------------------------------------------------------------------------

def keep(run, changes: WorkChanges | None) -> None:
    """Called by the run's one record write (records.record_run)."""
    if changes is None or not changes.files_total:
        return
    from apps.worker.models import RunChanges

    RunChanges.objects.create(
        run=run, files=changes.files, files_total=changes.files_total, commits=changes.commits,
        commits_total=changes.commits_total, diff=changes.diff, diff_bytes=changes.diff_bytes,
        truncated=changes.truncated, source=changes.source, summary=changes.summary, created_at=timezone.now())


def sweep(now: datetime | None = None) -> int:
    """Delete what is older than PI_JOB_LOG_RETENTION_DAYS (the diff is kept as long as a run's log would be)."""
    from apps.worker import run_logs
    from apps.worker.models import RunChanges

    return run_logs.delete_expired(RunChanges, "run_change", now)
