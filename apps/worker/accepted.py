"""Accepted jobs: the database records every job a producer acknowledged, and Redis is rebuilt from that record
when it lost its data.

    accept(spec, queue)        jobs.enqueue, once Redis holds the job: its row (AcceptedJob), before anyone answers
    started(job_id, attempt)   the horse, as an attempt begins; unstarted() when it was only deferred
    spending(job_id)           the ladder, once the attempt took its budget (for the budget windows' rebuild)
    already_run(job_id, n)     the horse, first: an attempt recorded already, or a settled job, is not run again
    settle(job_id)             when no attempt will follow (the last one recorded, an operator removed it)
    reconcile(redis)           queue again, under the same id, each open row's job that Redis no longer holds

A row stays open from its acceptance to its settling. The reconciler runs in the replayer's loop (at once when the
Redis it talks to is another process than the one it last reconciled, told apart by its run id: restarted empty,
or from an older copy of its data; and every PI_RECONCILE_SECONDS otherwise) and as each worker starts. For a job
Redis lost it reads the run records first, so nothing runs twice: a job whose last attempt is recorded as its end
is settled, not queued; an attempt started and not yet recorded may still be running on a worker that lost Redis
with it, so its job is queued again only once that attempt's time budget has passed, and only as the lost-worker
policy allows (PI_LOST_RETRIES: its worker died too); anything else is queued as
its next attempt (the one after the last recorded). A Redis restored from an older copy may also hand out a job
that has run since: the horse asks already_run() before anything and skips it. Each rebuild is logged
(`job_rebuilt`) and counted (JobsRebuilt: the fleet panel, `/metrics`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import F
from django.utils import timezone
from rq.job import Job

from apps.fleet.connection import process_run_id, unmarked_run_id

logger = logging.getLogger("pidispatch.jobs")

RECONCILED = "pidispatch:jobs:reconciled"  # the run id of the Redis process the record was last reconciled with
_CHUNK = 1000


def accept(job_id: str, queue: str, payload: dict) -> None:
    """The job's row (kept as it is when the id was accepted before). DatabaseError propagates: the producer must
    not acknowledge what the database could not record."""
    from .models import AcceptedJob

    # One INSERT ... ON CONFLICT DO NOTHING on the webhook's path (not a read, then a write).
    AcceptedJob.objects.bulk_create([AcceptedJob(job_id=job_id, queue=queue, payload=payload,
                                                 accepted_at=timezone.now())], ignore_conflicts=True)


def already_run(job_id: str, attempt: int) -> bool:
    """This attempt is recorded, or the job settled: a Redis restored from an older copy of its data hands out a
    job (or an attempt) that has run since. Unknown (the database away) is False: the ladder then waits for it."""
    from .models import AcceptedJob, Run

    try:
        return (Run.objects.filter(job_id=job_id, attempt=attempt).exists()
                or AcceptedJob.objects.filter(job_id=job_id, settled_at__isnull=False).exists())
    except DatabaseError:
        return False


def started(job_id: str, attempt: int) -> None:
    from .models import AcceptedJob

    _quietly("started", job_id, lambda: AcceptedJob.objects.filter(job_id=job_id).update(
        started_attempt=attempt, started_at=timezone.now(), spending_since=None))


def spending(job_id: str) -> None:
    """The attempt took its budget (gate 12 passed): a rebuild of the budget windows counts it in flight."""
    from .models import AcceptedJob

    _quietly("spending", job_id, lambda: AcceptedJob.objects.filter(job_id=job_id).update(
        spending_since=timezone.now()))


def unstarted(job_id: str) -> None:
    """The attempt only deferred (it goes back under its id, no attempt used): nothing of it runs."""
    from .models import AcceptedJob

    _quietly("unstarted", job_id, lambda: AcceptedJob.objects.filter(job_id=job_id, started_at__isnull=False).update(
        started_at=None))


def settle(job_id: str) -> None:
    """No attempt follows: the row closes and its texts go. A failure is logged only (the reconciler settles the
    row from the run records when it next finds the job gone from Redis)."""
    from .models import AcceptedJob

    _quietly("settle", job_id, lambda: AcceptedJob.objects.filter(job_id=job_id, settled_at__isnull=True).update(
        settled_at=timezone.now(), payload=None))


def _quietly(what: str, job_id: str, write) -> None:
    try:
        write()
    except DatabaseError as error:
        logger.warning("accepted_job_unwritten job=%s step=%s error=%s", job_id, what, type(error).__name__)


def reconcile_if_redis_changed(redis) -> int | None:
    """reconcile() when this Redis process was not reconciled with yet; None when it was (nothing done)."""
    run_id = unmarked_run_id(redis, RECONCILED)
    return None if run_id is None else reconcile(redis, run_id=run_id)


def reconcile(redis, run_id: str = "") -> int:
    """Queue again each open row's job that Redis does not hold and that may run again; settle those whose end is
    recorded. How many were queued. DatabaseError and RedisError propagate (the caller tries again later)."""
    from .jobs import JobSpec, JobSpecError, enqueue, job_time_budget_seconds
    from .models import AcceptedJob, JobsRebuilt

    run_id = run_id or process_run_id(redis)
    open_rows = AcceptedJob.objects.filter(settled_at__isnull=True)
    missing = _not_in_redis(redis, list(open_rows.values_list("job_id", flat=True)))
    rebuilt: list[int] = []
    now = timezone.now()
    budget = timedelta(seconds=job_time_budget_seconds())
    ended = _ended(missing)
    for row in _rows(open_rows, missing):
        recorded = ended.get(row.job_id)
        if recorded is True:
            settle(row.job_id)
            continue
        last_attempt = recorded or 0
        if row.started_attempt > last_attempt and row.started_at:
            if row.started_at > now - budget:
                continue  # that attempt may still be running, on a worker that lost Redis with it
            if not _lost_attempt_runs_again(row.job_id, row.started_attempt):
                logger.error("job_unrebuilt job=%s attempt=%d why=attempt-unrecorded", row.job_id, row.started_attempt)
                settle(row.job_id)
                continue
        try:
            spec = JobSpec.from_payload(row.payload or {})
        except JobSpecError:
            logger.error("job_unrebuildable job=%s why=payload-unreadable", row.job_id)
            settle(row.job_id)
            continue
        if enqueue(spec, row.queue, attempts_made=last_attempt, rebuilt=True).created:
            rebuilt.append(row.pk)
            logger.warning("job_rebuilt job=%s queue=%s attempt=%d", row.job_id, row.queue, last_attempt + 1)
    if rebuilt:
        for chunk in _chunks(rebuilt):
            AcceptedJob.objects.filter(pk__in=chunk).update(rebuilt=F("rebuilt") + 1)
        JobsRebuilt.objects.create(at=now, jobs=len(rebuilt), redis_run=run_id[:40])
        logger.warning("jobs_rebuilt count=%d redis_run=%s", len(rebuilt), run_id[:12])
    if run_id:
        redis.set(RECONCILED, run_id)
    return len(rebuilt)


def _lost_attempt_runs_again(job_id: str, attempt: int) -> bool:
    """An attempt that started and was never recorded, past its time budget: its worker died, and Redis's copy of
    the job with it. It runs again only as the lost-worker policy lets a dead worker's attempt (PI_LOST_RETRIES)."""
    from .models import LostRetry
    from .process.worker_lost import WORKER_LOST, retry_decision

    return retry_decision(job_id, attempt, WORKER_LOST) == LostRetry.RETRIED


def _chunks(items: list):
    for start in range(0, len(items), _CHUNK):
        yield items[start:start + _CHUNK]


def _rows(open_rows, job_ids: list[str]):
    for chunk in _chunks(job_ids):
        yield from open_rows.filter(job_id__in=chunk).only("job_id", "queue", "payload", "started_attempt",
                                                           "started_at")


def _not_in_redis(redis, job_ids: list[str]) -> list[str]:
    missing = []
    for chunk in _chunks(job_ids):
        pipe = redis.pipeline(transaction=False)
        for job_id in chunk:
            pipe.exists(Job.key_for(job_id))
        missing += [job_id for job_id, held in zip(chunk, pipe.execute(), strict=True) if not held]
    return missing


def _ended(job_ids: list[str]) -> dict[str, bool | int]:
    """Per job with run records: True when no attempt follows the recorded ones (one that did not fail, a lost one
    not run again, an operator's cancel, the retries used up), else the last recorded attempt."""
    from apps.fleet.models import CancelRequest

    from .models import LostRetry, Outcome, Run

    found: dict[str, list] = {}
    cancelled: set[str] = set()
    for chunk in _chunks(job_ids):
        for job_id, attempt, outcome, lost_retry in Run.objects.filter(job_id__in=chunk).values_list(
                "job_id", "attempt", "outcome", "lost_retry"):
            found.setdefault(job_id, []).append((attempt, outcome, lost_retry))
        cancelled.update(CancelRequest.objects.filter(job_id__in=chunk).values_list("job_id", flat=True))
    answer: dict[str, bool | int] = dict.fromkeys(cancelled, True)
    for job_id, runs in found.items():
        runs.sort()
        last_attempt, _, last_lost = runs[-1]
        lost_again = sum(1 for _, _, lost in runs if lost == LostRetry.RETRIED)
        final = (any(outcome != Outcome.FAILED for _, outcome, _ in runs)
                 or last_lost in (LostRetry.USED_UP, LostRetry.OFF, LostRetry.CANCELLED)
                 or last_attempt >= settings.PI_RETRY_ATTEMPTS + lost_again)
        answer[job_id] = True if final or job_id in cancelled else last_attempt
    return answer

