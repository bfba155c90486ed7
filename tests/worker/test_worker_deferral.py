"""A deferred job keeps its id, waits in RQ's scheduled registry, uses no attempt, and comes back."""

import time
from datetime import UTC, datetime

import pytest
from rq import Queue
from rq.registry import ScheduledJobRegistry

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_deferred_job_returns_under_the_same_id_without_using_an_attempt(run_worker, redis_conn):
    queue = Queue("pi-jobs", connection=redis_conn)
    queue.enqueue_call("tests.jobfuncs.defer_once", args=(60,), job_id="defer-me")

    run_worker("pi-jobs")

    job = queue.fetch_job("defer-me")
    assert job.get_status() == "scheduled"
    registry = ScheduledJobRegistry(queue=queue)
    assert registry.get_job_ids() == ["defer-me"]
    assert registry.get_scheduled_time("defer-me").timestamp() > time.time()
    assert queue.started_job_registry.get_job_ids() == []

    registry.schedule(job, datetime.now(UTC))  # its time has come
    time.sleep(1.1)
    run_worker("pi-jobs")

    job = queue.fetch_job("defer-me")
    assert job.get_status() == "finished"
    assert job.return_value() == {"runs": 2, "attempt": 1}
