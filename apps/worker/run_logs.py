"""Run logs, kept on purpose: a run's container output and the agent's summary (RunLog), only with
PI_CAPTURE_JOB_LOGS, since they hold issue text and the agent's output, which no Run record or log line may.

- Scrubbed before anything is kept: every value the job's secrets resolved to, the provider key and the job's forge
  token, as they are and encoded or split (scrubbing.py, the scrubber of what is posted too), become `[scrubbed]`.
  The scrub runs on the whole output, before it is cut, so a cut can never leave half a secret behind.
- Bounded: at most PI_JOB_LOG_MAX_BYTES of it (the first half and the last, with a line saying how much was left
  out); the engine itself keeps a container's last 1 MB.
- Kept for PI_JOB_LOG_RETENTION_DAYS, then deleted by every worker's periodic sweep (sweep()).
- Read only with `worker.view_run_log`: run_log_text() for any caller (the admin, the API), run_log_view() at
  run_log_url(run) for a person in the admin.

The summary (the runner's last assistant message) is kept in the log row only, so it goes with it; the Run record
keeps its length alone (Run.summary_chars).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import Http404, HttpResponse
from django.urls import path, reverse
from django.utils import timezone

from apps.worker.scrubbing import Scrubber

logger = logging.getLogger("pidispatch.run_logs")

PERMISSION = "worker.view_run_log"


@dataclass(frozen=True)
class CapturedLog:
    output: str
    summary: str
    output_bytes: int  # before it was cut
    truncated: bool


def _bounded(text: str, limit: int) -> tuple[str, bool]:
    raw = text.encode()
    if len(raw) <= limit:
        return text, False
    head, tail = limit // 2, limit - limit // 2
    cut = len(raw) - head - tail
    return (raw[:head].decode(errors="ignore") + f"\n[pidispatch: {cut} bytes left out]\n"
            + raw[-tail:].decode(errors="ignore")), True


def captured(output: bytes | None, summary: str, secret_values) -> CapturedLog | None:
    """What a run keeps of its output and summary: None unless its output was captured (PI_CAPTURE_JOB_LOGS)."""
    if output is None:
        return None
    scrubber = Scrubber(secret_values)
    # NUL is the one character no database text column takes (PostgreSQL refuses it).
    text = scrubber.scrub(output.decode(errors="replace")).replace("\x00", "\ufffd")
    summary = summary.replace("\x00", "\ufffd")
    bounded, truncated = _bounded(text, settings.PI_JOB_LOG_MAX_BYTES)
    return CapturedLog(output=bounded, summary=scrubber.scrub(summary), output_bytes=len(output), truncated=truncated)


def keep(run, log: CapturedLog | None) -> None:
    """Called by the run's one record write (records.record_run)."""
    if log is None:
        return
    from apps.worker.models import RunLog

    RunLog.objects.create(run=run, output=log.output, summary=log.summary, output_bytes=log.output_bytes,
                          truncated=log.truncated, created_at=timezone.now())
    logger.info("run_log_kept job=%s attempt=%s bytes=%d truncated=%s", run.job_id, run.attempt,
                log.output_bytes, log.truncated)


def sweep(now: datetime | None = None) -> int:
    """Delete the logs older than PI_JOB_LOG_RETENTION_DAYS (whether capture is on now or not)."""
    from apps.worker.models import RunLog

    return delete_expired(RunLog, "run_log", now)


def delete_expired(model, name: str, now: datetime | None = None) -> int:
    """Delete `model`'s rows created more than PI_JOB_LOG_RETENTION_DAYS ago (a run's log and its kept changes);
    a database fault is logged and left to the next beat."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.PI_JOB_LOG_RETENTION_DAYS)
    expired = model.objects.filter(created_at__lt=cutoff)
    try:
        # Looked for first: this runs at every worker's beat, and a DELETE takes SQLite's write lock even when
        # it matches nothing.
        deleted = expired.delete()[0] if expired.exists() else 0
    except DatabaseError as exc:
        logger.warning("%s_sweep_failed error=%s", name, type(exc).__name__)
        return 0
    if deleted:
        logger.info("%ss_swept count=%d", name, deleted)
    return deleted


# --- reading ------------------------------------------------------------------------------------------

def can_view_run_log(user) -> bool:
    return bool(user and user.is_active and user.has_perm(PERMISSION))


def run_log_text(run, user) -> str:
    """The run's kept log as text (its summary, then its output). Raises PermissionDenied without
    `worker.view_run_log`, Http404 when the run has no log (never captured, or swept)."""
    from apps.worker.models import RunLog

    if not can_view_run_log(user):
        raise PermissionDenied("reading a run's log needs the permission worker.view_run_log")
    try:
        log = RunLog.objects.get(run=run)
    except RunLog.DoesNotExist:
        raise Http404("this run has no log: PI_CAPTURE_JOB_LOGS was off, or it is older than "
                      "PI_JOB_LOG_RETENTION_DAYS") from None
    cut = f", cut to {settings.PI_JOB_LOG_MAX_BYTES} bytes" if log.truncated else ""
    return (f"run {run.job_id} attempt {run.attempt} ({run.outcome} {run.reason or ''})\n"
            f"--- summary ---\n{log.summary}\n"
            f"--- output ({log.output_bytes} bytes{cut}) ---\n{log.output}")


def has_log(run) -> bool:
    from apps.worker.models import RunLog

    return RunLog.objects.filter(run=run).exists()


@staff_member_required
def run_log_view(request, pk: int):
    from apps.worker.models import Run

    try:
        run = Run.objects.get(pk=pk)
    except Run.DoesNotExist:
        raise Http404("no such run") from None
    text = run_log_text(run, request.user)
    logger.info("run_log_read job=%s attempt=%s user_id=%s", run.job_id, run.attempt, request.user.pk)
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    response["X-Content-Type-Options"] = "nosniff"
    return response


def run_log_url(run) -> str:
    """Where the run's admin page links `View log` (for users with the permission, when the run has one)."""
    return reverse("worker-run-log", args=[run.pk])


def admin_link(run) -> str:
    """The run admin page's `View log` (the page shows it only to whoever may read it: admin_fieldsets)."""
    from django.utils.html import format_html

    if not has_log(run):
        return "none kept (PI_CAPTURE_JOB_LOGS off, or past PI_JOB_LOG_RETENTION_DAYS)"
    return format_html('<a href="{}">View log</a>', run_log_url(run))


LOG_FIELDS = ("view_log", "agent_summary")  # what only a reader of run logs sees on the run page


def admin_fieldsets(fieldsets, user):
    """The run admin's fieldsets without the log's fields for a user without worker.view_run_log."""
    if can_view_run_log(user):
        return fieldsets
    return [(name, {**options, "fields": tuple(field for field in options["fields"] if field not in LOG_FIELDS)})
            for name, options in fieldsets]


def kept_summary(run) -> str | None:
    """The agent's summary as its run log keeps it; None when no log is kept (only its length is then known)."""
    from apps.worker.models import RunLog

    return RunLog.objects.filter(run=run).values_list("summary", flat=True).first()


urlpatterns = [path("admin/worker/run/<int:pk>/log/", run_log_view, name="worker-run-log")]
