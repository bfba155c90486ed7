"""What the admin fleet panel shows: the fleet snapshot (Redis) beside the day's spend.

Display code, so it may read the worker's counters and models (DESIGN section 1): the job-count counters
the caps are checked against (UTC day, Monday week, month; refused reservations count), today's tokens,
and today's cost from the run history.
"""

from __future__ import annotations

from django.db import DatabaseError
from redis.exceptions import RedisError

# The spend computation is the worker's (apps/worker/spend.py), shared with the API and the cost page.
from apps.worker.spend import Meter, Spend, spend, windows  # noqa: F401

from . import status, topology


def failure_reasons(job_ids) -> dict[str, str]:
    """The latest run record's outcome/reason of each failed job."""
    from apps.worker.models import Run

    return {job_id: f"{outcome} {reason}".strip()
            for job_id, (_, _, outcome, reason) in Run.objects.latest_outcomes(job_ids).items()}


RECENT_PUBLICATIONS = 8


def recent_publications():
    """The latest runs whose work reached the forge as a pull/merge request, newest first (their links)."""
    from apps.worker.models import Run

    return list(Run.objects.recently_published(RECENT_PUBLICATIONS).values(
        "job_id", "kind", "target", "publish_outcome", "pull_request", "publish_url", "ended_at"))


def explanations(reasons: dict[str, str]) -> dict[str, str]:
    """Each failed job's reason in words (the reason table), for the panel's hover."""
    from apps.worker.reasons import explain

    found = {}
    for job_id, text in reasons.items():
        reason = explain(text.partition(" ")[2])
        if reason:
            found[job_id] = f"{reason.means} Next: {reason.next_step}"
    return found


REBUILDS_SHOWN_DAYS = 7


def recent_rebuild():
    """The last time Redis had lost accepted jobs and they were queued again from the database (within a week), with
    the count since the first time: the operator sees that it happened and that nothing was lost."""
    from datetime import timedelta

    from django.db.models import Sum
    from django.utils import timezone

    from apps.worker.models import JobsRebuilt

    last = JobsRebuilt.objects.filter(at__gte=timezone.now() - timedelta(days=REBUILDS_SHOWN_DAYS)).first()
    if last is None:
        return None
    return {"at": last.at, "jobs": last.jobs, "total": JobsRebuilt.objects.aggregate(n=Sum("jobs"))["n"]}


def context(redis) -> dict:
    data: dict = {"snapshot": None, "spend": None, "redis_error": "", "db_error": "", "reasons": {},
                  "explained": {}, "publications": [], "rebuilt": None, "topology": None}
    try:
        data["snapshot"] = status.snapshot(redis)
        data["topology"] = topology.read(redis)
    except RedisError as exc:
        data["redis_error"] = f"Redis unreachable ({type(exc).__name__}): the fleet cannot be shown or steered"
    try:
        data["spend"] = spend(redis)
        if data["snapshot"]:
            data["reasons"] = failure_reasons(f.job_id for f in data["snapshot"].failed)
            data["explained"] = explanations(data["reasons"])
        data["publications"] = recent_publications()
        data["rebuilt"] = recent_rebuild()
    except (DatabaseError, RedisError) as exc:
        data["db_error"] = f"spend and run history unreadable ({type(exc).__name__})"
    return data
