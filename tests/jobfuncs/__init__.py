"""Job functions the worker-class tests enqueue (a real worker imports them from here)."""

from datetime import timedelta

from django.utils import timezone
from rq import get_current_job

from apps.fleet.connection import get_redis
from apps.worker.gates.verdicts import Deferred


def defer_once(seconds: float):
    """Defers itself the first time it runs, and counts its runs in Redis."""
    job = get_current_job()
    runs = get_redis().incr(f"test:runs:{job.id}")
    if runs == 1:
        return Deferred(until=timezone.now() + timedelta(seconds=seconds), reason="test")
    return {"runs": runs, "attempt": (job.number_of_retries or 0) + 1}
