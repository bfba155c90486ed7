"""django-rq's `rqworker-pool` runs N processes of the worker class on one host: each publishes itself
under the host, they share the work, and each honours pause flags."""

import time

import pytest

from apps.fleet import pauses
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import host_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def test_a_pool_of_two_processes_drains_the_host_queue_and_honours_pauses(start_worker, redis_conn, fast_fleet):
    start_worker("pi-jobs", "pi-jobs@hostP", pool=2, env={"PI_WORKER_NAME": "hostP"})
    row = wait_for(lambda: (h := host_row(redis_conn, "hostP")) and len(h.processes) == 2 and h, timeout=90,
                   what="both pool processes in the registry")
    assert row.declared and row.queues == ("pi-jobs", "pi-jobs@hostP")

    for index in range(2):
        enqueue_spec(forge_spec(f"gh-pool-{index}", body="fake-agent:sleep=4"), "pi-jobs@hostP")
    busy = wait_for(lambda: (h := host_row(redis_conn, "hostP")) and h.busy == 2 and h, timeout=90,
                    what="both processes busy at once")
    assert {job.job_id for job in busy.running} == {"gh-pool-0", "gh-pool-1"}
    for index in range(2):
        run = wait_for(lambda index=index: Run.objects.filter(job_id=f"gh-pool-{index}").first(), timeout=90,
                       what="the run")
        assert (run.outcome, run.host) == (Outcome.COMPLETED, "hostP")

    pauses.pause(redis_conn, ["pi-jobs@hostP"], by="test")
    time.sleep(3)
    enqueue_spec(forge_spec("gh-pool-paused"), "pi-jobs@hostP")
    time.sleep(3)
    assert not Run.objects.filter(job_id="gh-pool-paused").exists()
    pauses.resume(redis_conn, ["pi-jobs@hostP"], by="test")
    wait_for(lambda: Run.objects.filter(job_id="gh-pool-paused").exists(), timeout=90, what="the resumed job")
