"""A real worker honours per-queue pause flags: a paused queue is skipped within about a second, the
other queues keep draining, a running job finishes, and resuming lets the held-back jobs run."""

import time

import pytest
from rq import Queue

from apps.fleet import pauses
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

# "About a second" for the worker, with room for a loaded 2-core machine: generous, never tight.
PAUSE_TAKES_HOLD = 3


def ran(job_id: str) -> Run | None:
    return Run.objects.filter(job_id=job_id).first()


def test_a_paused_queue_is_skipped_while_the_other_queue_keeps_draining(start_worker, redis_conn, fast_fleet):
    worker = start_worker("pi-jobs", "pi-jobs@hostA", env={"PI_WORKER_NAME": "hostA"})
    enqueue_spec(forge_spec("gh-warmup"), "pi-jobs")
    wait_for(lambda: ran("gh-warmup"), timeout=90, what="the worker to run a first job")

    pauses.pause(redis_conn, ["pi-jobs@hostA"], by="test", note="maintenance")
    time.sleep(PAUSE_TAKES_HOLD)
    enqueue_spec(forge_spec("gh-held-back"), "pi-jobs@hostA")
    enqueue_spec(forge_spec("gh-shared"), "pi-jobs")

    shared = wait_for(lambda: ran("gh-shared"), timeout=90, what="the shared queue to keep draining")
    assert shared.outcome == Outcome.COMPLETED
    time.sleep(2)  # several pause checks after the shared job: the host queue's job must still wait
    assert ran("gh-held-back") is None
    assert Queue("pi-jobs@hostA", connection=redis_conn).get_job_ids() == ["gh-held-back"]
    assert worker.alive()
    assert "queue_paused queue=pi-jobs@hostA" in worker.output()

    pauses.resume(redis_conn, ["pi-jobs@hostA"], by="test")

    run = wait_for(lambda: ran("gh-held-back"), timeout=90, what="the resumed queue's job")
    assert (run.outcome, run.queue, run.host) == (Outcome.COMPLETED, "pi-jobs@hostA", "hostA")


def test_pausing_a_queue_lets_its_running_job_finish(start_worker, redis_conn, fast_fleet, job_containers):
    start_worker("pi-jobs")
    enqueue_spec(forge_spec("gh-long", body="fake-agent:sleep=4"), "pi-jobs")
    wait_for(lambda: "gh-long" in job_containers(), timeout=90, what="the job's container")

    pauses.pause(redis_conn, ["pi-jobs"], by="test")
    enqueue_spec(forge_spec("gh-after-pause"), "pi-jobs")

    run = wait_for(lambda: ran("gh-long"), timeout=90, what="the running job to finish")
    assert run.outcome == Outcome.COMPLETED
    time.sleep(PAUSE_TAKES_HOLD)
    assert ran("gh-after-pause") is None  # jobs still enqueue while paused; none is taken


def test_a_pause_with_an_auto_resume_time_ends_by_itself(start_worker, redis_conn, fast_fleet):
    from datetime import timedelta

    from django.utils import timezone

    from apps.fleet.models import FleetAction

    start_worker("pi-jobs")
    pauses.pause(redis_conn, ["pi-jobs"], by="test", until=timezone.now() + timedelta(seconds=4))
    enqueue_spec(forge_spec("gh-auto-resumed"), "pi-jobs")
    time.sleep(2)
    assert ran("gh-auto-resumed") is None

    run = wait_for(lambda: ran("gh-auto-resumed"), timeout=90, what="the queue to resume at its `until`")
    assert run.outcome == Outcome.COMPLETED
    assert not redis_conn.exists(pauses.flag_key("pi-jobs"))
    assert FleetAction.objects.filter(action="auto-resume", queues=["pi-jobs"]).exists()


def test_a_burst_worker_with_every_queue_paused_takes_nothing(run_worker, redis_conn):
    enqueue_spec(forge_spec("gh-paused-burst"), "pi-jobs")
    pauses.pause(redis_conn, ["pi-jobs"], by="test")

    run_worker("pi-jobs")

    assert ran("gh-paused-burst") is None
    assert Queue("pi-jobs", connection=redis_conn).get_job_ids() == ["gh-paused-burst"]
