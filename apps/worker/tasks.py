"""The function every queued job runs inside the RQ work horse."""

import logging
import math

from django.conf import settings
from django.db import DatabaseError
from rq import Retry, get_current_job

from apps.fleet.hosts import this_host
from apps.worker import accepted
from apps.worker.gates import ladder
from apps.worker.gates.verdicts import Deferred, Verdict, database_unavailable
from apps.worker.jobs import JobSpec, JobSpecError
from apps.worker.models import Outcome, Run
from apps.worker.progress.tracker import Progress
from apps.worker.records import record_run, record_unreadable_job

logger = logging.getLogger("pidispatch.worker")


def _retry_policy(job_id: str, at_least: float = 0) -> Retry:
    """PI_RETRY_ATTEMPTS (2) attempts ending in an infrastructure fault, exponential backoff from
    PI_RETRY_BACKOFF_SECONDS, and never sooner than the forge asked (`at_least`: its Retry-After, bounded). Attempts
    run again after a lost worker are their own policy's and do not use these up (RQ counts every attempt, so its
    ceiling rises by them)."""
    base = settings.PI_RETRY_BACKOFF_SECONDS
    retries = settings.PI_RETRY_ATTEMPTS - 1
    floor = math.ceil(at_least)
    return Retry(max=retries + Run.objects.lost_retries(job_id),
                 interval=[max(base * 2**i, floor) for i in range(retries)] or [max(base, floor)])


def execute_job(payload: dict):
    job = get_current_job()
    attempt = (job.number_of_retries or 0) + 1
    host = this_host().name
    try:
        spec = JobSpec.from_payload(payload)
    except JobSpecError as exc:
        # Version skew between a producer and this worker: determinate, so refused and never retried.
        logger.error("job_payload_invalid job=%s error=%s", job.id, exc)
        spec = None
    if spec is None:
        try:
            record_unreadable_job(job.id, attempt=attempt, host=host, queue=job.origin)
        except DatabaseError:
            return database_unavailable()  # refused once it can be recorded
        accepted.settle(job.id)
        return {"outcome": Outcome.POLICY, "reason": "job-payload-invalid"}
    if accepted.already_run(spec.job_id, attempt):
        logger.warning("job_skipped job=%s attempt=%d why=already-run", spec.job_id, attempt)
        return {"outcome": "skipped", "reason": "already-run"}  # nothing recorded: its record exists
    accepted.started(spec.job_id, attempt)

    progress = Progress(spec.job_id, host=host, attempt=attempt, forge=spec.kind, delivery_id=spec.delivery_id,
                        trigger_id=spec.trigger_id)
    progress.queued(job.enqueued_at)
    progress.passed("picked-up")
    try:
        verdict = ladder.run(spec, host, progress=progress, queue=job.origin)
    except Exception:
        # Our own bug: recorded as failed (the job leaves a trace), not retried, traceback in the log.
        logger.exception("job_worker_error job=%s", spec.job_id)
        crashed = Verdict(outcome=Outcome.FAILED, reason="worker-error")
        run = record_run(spec, crashed, attempt=attempt, host=host, queue=job.origin)
        progress.ended(crashed.outcome, crashed.reason, run.pk)
        accepted.settle(spec.job_id)
        raise
    if isinstance(verdict, Deferred):
        progress.deferred(verdict.reason, verdict.until)
        accepted.unstarted(spec.job_id)
        return verdict  # the worker class puts it back under the same id; no attempt, no record
    try:
        run = record_run(spec, verdict, attempt=attempt, host=host, queue=job.origin)
        progress.ended(verdict.outcome, verdict.reason, run.pk)
    except DatabaseError:
        if verdict.budget_reserved:
            raise  # it took a budget slot or ran: sending it back could spend twice
        logger.warning("job_record_deferred job=%s reason=%s", spec.job_id, verdict.reason or verdict.outcome)
        return database_unavailable()  # nothing spent: the job climbs again once the database answers
    if verdict.retryable:
        retry = _retry_policy(spec.job_id, verdict.retry_after_seconds)
        if attempt > retry.max:  # RQ's test (its retries so far, attempt - 1, reached the most): none follows
            accepted.settle(spec.job_id)
        return retry
    accepted.settle(spec.job_id)
    return {"outcome": verdict.outcome, "reason": verdict.reason}
