"""Where each job stands now: its RQ status (Redis) beside its latest run record (database).

A delivery's own status says how intake went ("queued"); what the operator wants is what became of the
jobs it queued, so the inbox asks here. One Redis round trip and one query for any number of jobs.

    job_states(redis, ["gh-1", "gh-2"]) -> {"gh-1": JobState("failed", run_pk=12, detail="worker-lost"), ...}
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import RedisError
from rq.job import Job

from .connection import text

# RQ's status -> the operator's word. "scheduled" is how a deferred (pause window, busy scope) or
# backing-off job waits; "deferred" in RQ's own sense (a dependency) reads the same to an operator.
_RQ_WORDS = {"queued": "queued", "scheduled": "deferred", "deferred": "deferred", "started": "running",
             "failed": "failed", "stopped": "cancelled", "canceled": "cancelled"}


@dataclass(frozen=True)
class JobState:
    state: str          # queued | deferred | running | completed | policy | failed | cancelled | unknown
    run_pk: int | None = None
    attempt: int | None = None
    detail: str = ""    # the latest record's reason, or why the state is unknown


def job_states(redis, job_ids) -> dict[str, JobState]:
    from apps.worker.models import Run

    job_ids = list(dict.fromkeys(job_id for job_id in job_ids if job_id))
    if not job_ids:
        return {}
    latest = Run.objects.latest_outcomes(job_ids)
    statuses: dict[str, str] = {}
    redis_error = ""
    try:
        pipe = redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(Job.key_for(job_id), "status")
        statuses = {job_id: text(status) for job_id, status in zip(job_ids, pipe.execute(), strict=True)}
    except RedisError as exc:
        redis_error = f"Redis unreachable ({type(exc).__name__})"

    states = {}
    for job_id in job_ids:
        pk, attempt, outcome, reason = latest.get(job_id, (None, None, "", ""))
        word = _RQ_WORDS.get(statuses.get(job_id, ""))
        if word is None:  # finished, or gone from Redis: the record says how it ended
            if outcome:
                word = outcome
            else:
                word, reason = "unknown", redis_error or "not in Redis and never recorded (expired, or cancelled)"
        elif word in ("queued", "deferred") and outcome == "failed":
            reason = f"retrying after {reason}"  # a retry's backoff: the last attempt failed
        states[job_id] = JobState(word, run_pk=pk, attempt=attempt, detail=reason)
    return states


# A delivery's jobs read as one word, the most telling first: any still going, then the worst end.
_OVERALL_ORDER = ("running", "queued", "deferred", "failed", "policy", "cancelled", "unknown", "completed")


def overall(states: dict[str, JobState], job_ids) -> str:
    """The word for several jobs' states (a delivery's replicas; `states` as job_states() answers): `running` while
    any runs, `queued` or `deferred` while any waits, else the worst way one ended (failed, policy, cancelled,
    unknown) or `completed`."""
    words = {states[job_id].state if job_id in states else "unknown" for job_id in job_ids}
    return next((word for word in _OVERALL_ORDER if word in words), "unknown")
