"""What the worker tells the issue or pull request: one fixed sentence per refusal and per terminal stop.

Where it hooks in: `on_run_recorded`, a receiver of `apps.worker.records.run_recorded` (connected in
`WorkerConfig.ready`). Every run record, whoever writes it (the job's work horse, or the worker that
settles a lost job), passes through there once per attempt, after the record is safely written:

- a policy outcome (a pre-spend refusal "Refused: ... Not run.", or a stop after spend "Stopped: ...")
  posts its sentence;
- a failed attempt that will be retried posts nothing (a lost attempt run again included); the final failed
  attempt posts once;
- a completed run posts nothing here: its publish step (apps/worker/forges/publishing/) opened a pull request or
  commented with the agent's own summary; a publish refusal is a policy outcome and posts its sentence.

The sentences are fixed text: never a host path, an amount, a secret reference or a login (they also
land in logs). A local job has no forge: its sentence is logged instead. Posting never fails the job; a
failure is logged with its reason token only.
"""

from __future__ import annotations

import logging

from django.conf import settings

from apps.worker.forges import ForgeFailure, forge_client
from apps.worker.jobs import FORGE_KINDS, JobSpec
from apps.worker.models import LostRetry, Outcome, Run
from apps.worker.reasons import FAILED, FAILED_DEFAULT, NOT_RETRIED_FAILURES, REFUSED, STOPPED  # noqa: F401 (one table)
from apps.worker.sandbox.forge_workspace import repo_ref

logger = logging.getLogger("pidispatch.comments")

def is_final(run: Run) -> bool:
    """Will this attempt be the job's last? Only failed attempts can be followed by another: a lost one as its
    retry decision says, an infrastructure fault until PI_RETRY_ATTEMPTS of them (lost attempts run again do
    not count)."""
    if run.lost_retry:
        return run.lost_retry != LostRetry.RETRIED
    if run.outcome != Outcome.FAILED or run.reason in NOT_RETRIED_FAILURES:
        return True
    faults = run.attempt - (Run.objects.lost_retries(run.job_id, before=run.attempt) if run.attempt > 1 else 0)
    return faults >= settings.PI_RETRY_ATTEMPTS


def sentence_for(run: Run) -> str | None:
    """The one sentence this run record stands for on the forge, or None when it says nothing."""
    if run.outcome == Outcome.COMPLETED or not is_final(run):
        return None
    if run.outcome == Outcome.FAILED:
        return FAILED.get(run.reason, FAILED_DEFAULT)
    if run.exit_code is None:  # refused before any container ran
        return REFUSED.get(run.reason) or f"Refused: this job was refused before it started ({run.reason}). Not run."
    return STOPPED.get(run.reason) or f"Stopped: the run ended as {run.reason}. Partial work may exist. Not retried."


def post(spec: JobSpec, reason: str, text: str) -> bool:
    """Post `text` on the job's issue or pull request (a local job: log it). Never raises."""
    if spec.kind not in FORGE_KINDS:
        logger.info("comment job=%s reason=%s text=%r", spec.job_id, reason or "-", text)
        return True
    if spec.number is None:
        logger.info("comment_skipped job=%s reason=%s why=no-target", spec.job_id, reason or "-")
        return False
    try:
        forge_client(spec.kind).post_comment(repo_ref(spec), spec.target_type, spec.number, text)
    except ForgeFailure as failure:
        logger.warning("comment_failed job=%s reason=%s why=%s", spec.job_id, reason or "-", failure.reason)
        return False
    except Exception as error:  # a comment must never fail the job, whatever went wrong
        logger.warning("comment_failed job=%s reason=%s why=%s", spec.job_id, reason or "-", type(error).__name__)
        return False
    logger.info("comment_posted job=%s reason=%s", spec.job_id, reason or "-")
    return True


def on_run_recorded(sender, run: Run, spec: JobSpec, **kwargs) -> None:
    """`apps.worker.records.run_recorded` receiver: the one place status comments are posted from."""
    text = sentence_for(run)
    if text is not None:
        post(spec, run.reason, text)
