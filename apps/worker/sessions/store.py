"""Checking a target's session out into a job's folder, and promoting what the run left there (see __init__)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, transaction

from apps.worker.jobs import JobSpec
from apps.worker.models import AgentSession, ResumeReason
from apps.worker.scrubbing import Scrubber
from apps.worker.sessions import transcript as transcripts

logger = logging.getLogger("pidispatch.sessions")

FOLDER = "session"  # in the job's folder, beside job/ and workspace/
MOUNT = "/session"  # where the container sees it (the runner's PI_RUNNER_SESSION_DIR default)
FILE = "session.jsonl"


@dataclass
class Resume:
    """One job's resume: the target's key (None: it has none, a fork), whether the session was there, why not,
    the folder to mount (None: nothing is mounted and nothing kept), and the bytes this run kept."""

    key: str | None
    resumed: bool = False
    reason: str = ""
    folder: Path | None = None
    kept_bytes: int | None = None
    given: bytes = b""  # the transcript checked out for this job (vetted when it was kept)

    def record_fields(self) -> dict:
        return {"resumed": self.resumed, "resume_reason": self.reason, "session_bytes": self.kept_bytes}


def target_key(spec: JobSpec) -> str:
    """The session's key: a digest (the row names no repository), of `cron:<trigger id>` for a cron trigger's jobs,
    else of the trigger, the forge and the target (`trigger:3:github:acme/web#7`). One trigger's jobs never read
    another's transcript: two triggers on one issue may run different flows for people of different standing."""
    if spec.trigger_type == "cron" and spec.trigger_id is not None:
        name = f"cron:{spec.trigger_id}"
    else:
        name = f"trigger:{spec.trigger_id if spec.trigger_id is not None else '-'}:{spec.kind}:{spec.target}"
    return hashlib.sha256(name.encode()).hexdigest()


def _is_fork(pull) -> bool:
    return pull is not None and not pull.same_repository


def checkout(spec: JobSpec, job_root: Path, owner: tuple[int, int], now: datetime, pull=None) -> Resume:
    """The session folder of a `run.resume` job, holding a copy of its target's session when one is kept.
    `pull` is the forge's own word on a pull request's head (a fork's gets nothing)."""
    if _is_fork(pull):
        logger.info("session_not_resumed job=%s reason=%s", spec.job_id, ResumeReason.FORK)
        return Resume(key=None, reason=ResumeReason.FORK)
    key = target_key(spec)
    try:
        row = AgentSession.objects.filter(key=key).first()
        if row is not None and row.expires_at <= now:
            AgentSession.objects.filter(pk=row.pk, expires_at__lte=now).delete()
    except DatabaseError as error:
        logger.warning("session_store_unavailable job=%s error=%s", spec.job_id, type(error).__name__)
        return Resume(key=None, reason=ResumeReason.STORE_UNAVAILABLE)
    transcript = None
    if row is None:
        reason = ResumeReason.NO_SESSION
    elif row.expires_at <= now:
        reason = ResumeReason.EXPIRED
    elif not row.kept:
        reason = ResumeReason.TOO_LARGE
    else:
        transcript = _decompress(bytes(row.transcript or b""))
        reason = "" if transcript else ResumeReason.NO_SESSION
    folder = job_root / FOLDER
    folder.mkdir(mode=0o755)
    if transcript:
        path = folder / FILE
        path.write_bytes(transcript)
        path.chmod(0o644)
        _hand_over(path, owner)
    _hand_over(folder, owner)
    logger.info("session_checked_out job=%s resumed=%s reason=%s bytes=%d", spec.job_id, bool(transcript),
                reason or "-", len(transcript or b""))
    return Resume(key=key, resumed=bool(transcript), reason=reason, folder=folder, given=transcript or b"")


def _hand_over(path: Path, owner: tuple[int, int]) -> None:
    if os.geteuid() == 0:
        os.chown(path, *owner)


def _decompress(data: bytes) -> bytes:
    """A kept transcript, bounded again (a row written under a larger limit is cut off, not loaded whole)."""
    try:
        decompressor = zlib.decompressobj()
        transcript = decompressor.decompress(data, settings.PI_SESSION_MAX_BYTES + 1)
    except zlib.error:
        return b""
    return b"" if len(transcript) > settings.PI_SESSION_MAX_BYTES else transcript


def _read_transcript(folder: Path) -> tuple[bytes | None, int]:
    """What the run left at /session/session.jsonl: (its bytes, its size), or (None, size) when it is larger than
    the limit, (None, 0) when there is none. The container wrote the folder: a link or anything but a regular file
    is not followed or read."""
    try:
        descriptor = os.open(folder / FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None, 0
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, 0
        limit = settings.PI_SESSION_MAX_BYTES
        if info.st_size > limit:
            return None, info.st_size
        data = file.read(limit + 1)
    if len(data) > limit:
        return None, len(data)
    return data, len(data)


def _job_prompt(folder: Path) -> str:
    """The job's prompt.md, which the worker wrote beside the session folder and the container sees read-only."""
    try:
        return (folder.parent / "job" / transcripts.PROMPT_FILE.rsplit("/", 1)[1]).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def promote(resume: Resume, spec: JobSpec, host: str, scrub: list[str], now: datetime) -> Resume:
    """Keep what a completed run left for the target's next job (the target's row, written over). A transcript over
    the limit is not kept; the row then says so. Never raises: a session that cannot be kept is logged and lost."""
    if resume.key is None or resume.folder is None:
        return resume
    data, size = _read_transcript(resume.folder)
    if data is None and size == 0:
        logger.info("session_not_kept job=%s why=none-written", spec.job_id)
        return resume
    fields = {"job_id": spec.job_id, "host": host, "updated_at": now,
              "expires_at": now + timedelta(days=settings.PI_SESSION_TTL_DAYS), "size": size}
    if data is not None:
        vetted = transcripts.vet(data, given=resume.given, prompt=_job_prompt(resume.folder))
        if vetted.dropped:
            logger.warning("session_turns_dropped job=%s count=%d why=not-written-by-pi", spec.job_id, vetted.dropped)
        data = vetted.data
        if not data:
            logger.info("session_not_kept job=%s why=none-written", spec.job_id)
            return resume
    if data is None:
        fields.update(kept=False, transcript=None)
    else:
        values = [value for value in scrub if value]
        text = data.decode("utf-8", errors="replace")
        if values:
            text = Scrubber(values).scrub(text)
        data = text.encode("utf-8")
        fields.update(kept=True, transcript=zlib.compress(data, 6), size=len(data))
    try:
        with transaction.atomic():
            AgentSession.objects.update_or_create(key=resume.key, defaults=fields)
        AgentSession.objects.expired(now).delete()
    except DatabaseError as error:
        logger.warning("session_not_kept job=%s why=store-unavailable error=%s", spec.job_id, type(error).__name__)
        return resume
    if data is None:
        logger.info("session_not_kept job=%s why=too-large bytes=%d", spec.job_id, size)
        return resume
    logger.info("session_kept job=%s bytes=%d", spec.job_id, fields["size"])
    resume.kept_bytes = fields["size"]
    return resume
