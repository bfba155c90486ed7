"""A job whose worker died is recorded `failed` / `worker-lost`, whichever way the loss is found, and never
silently re-run (here the lost-retry policy is off: tests/worker/test_lost_retry.py runs lost jobs again); at
boot a worker removes this host's stray job containers, but never one a live sibling process is running.
However it ended, the copy RQ keeps of the job holds none of its texts."""

import os
import time

import pytest
from rq.command import send_stop_job_command
from rq.job import Job

from apps.worker.models import LostRetry, Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec, keys_holding, marked_spec
from tests.process_support import group_alive, horse_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

HOST = {"PI_WORKER_NAME": "hostA", "PI_LOST_RETRIES": "0"}
QUEUES = ("pi-jobs", "pi-jobs@hostA")


def runs(job_id):
    return list(Run.objects.filter(job_id=job_id).order_by("attempt"))


def test_a_worker_killed_mid_job_is_reaped_and_recorded_at_restart_and_nothing_reruns(
        start_worker, redis_conn, fast_fleet, job_containers):
    first = start_worker(*QUEUES, env=HOST, name="first")
    enqueue_spec(marked_spec("gh-orphaned", body="fake-agent:sleep=60"), "pi-jobs@hostA")
    wait_for(lambda: job_containers("hostA").get("gh-orphaned"), timeout=90, what="the job's container")

    first.kill()
    wait_for(lambda: not group_alive(first.pid), timeout=30, what="its scheduler and horse to die with it")
    assert "gh-orphaned" in job_containers("hostA")  # the engine keeps it: nothing in the dead worker can stop it
    start_worker(*QUEUES, env=HOST, name="restarted")

    wait_for(lambda: "gh-orphaned" not in job_containers("hostA"), timeout=60, what="the boot reaper")
    (run,) = wait_for(lambda: runs("gh-orphaned"), timeout=30, what="the worker-lost record")
    assert (run.outcome, run.reason, run.attempt, run.host, run.lost_retry) == (
        Outcome.FAILED, "worker-lost", 1, "hostA", LostRetry.OFF)
    # RQ's failure mark follows the record (and its status comment): poll, bounded.
    wait_for(lambda: Job.fetch("gh-orphaned", connection=redis_conn).get_status() == "failed", timeout=15,
             what="RQ to mark the job failed")
    time.sleep(4)  # retries would come back within a second (PI_RETRY_BACKOFF_SECONDS=1): none does
    assert len(runs("gh-orphaned")) == 1 and "gh-orphaned" not in job_containers()
    assert keys_holding(redis_conn) == []


def test_the_boot_reaper_keeps_a_live_siblings_container(start_worker, redis_conn, fast_fleet, job_containers):
    start_worker(*QUEUES, env=HOST, name="busy")
    enqueue_spec(forge_spec("gh-siblings-job", body="fake-agent:sleep=8"), "pi-jobs@hostA")
    wait_for(lambda: job_containers("hostA").get("gh-siblings-job"), timeout=90, what="the job's container")

    newcomer = start_worker(*QUEUES, env=HOST, name="newcomer")
    wait_for(lambda: "Listening on" in newcomer.output(), timeout=60, what="the second process to take work")

    assert "boot_reaper_kept job=gh-siblings-job why=live-sibling" in newcomer.output()
    (run,) = wait_for(lambda: runs("gh-siblings-job"), timeout=90, what="the sibling's job to finish")
    assert run.outcome == Outcome.COMPLETED


def test_a_worker_that_dies_for_good_has_its_job_settled_by_a_live_worker(start_worker, redis_conn, fast_fleet,
                                                                        job_containers):
    doomed = start_worker("pi-jobs", "pi-jobs@hostB", env={"PI_WORKER_NAME": "hostB", "PI_LOST_RETRIES": "0"},
                          name="hostB")
    enqueue_spec(marked_spec("gh-host-lost", body="fake-agent:sleep=60"), "pi-jobs")
    wait_for(lambda: job_containers("hostB").get("gh-host-lost"), timeout=90, what="the job's container on hostB")
    doomed.kill()

    start_worker(*QUEUES, env=HOST, name="hostA")

    (run,) = wait_for(lambda: runs("gh-host-lost"), timeout=60, what="hostA's sweep to settle the job")
    assert (run.outcome, run.reason, run.host) == (Outcome.FAILED, "worker-lost", "hostB")
    # RQ's failure mark follows the record (and its status comment): poll, bounded.
    wait_for(lambda: Job.fetch("gh-host-lost", connection=redis_conn).get_status() == "failed", timeout=15,
             what="RQ to mark the job failed")
    time.sleep(3)
    assert len(runs("gh-host-lost")) == 1
    assert keys_holding(redis_conn) == []


def test_a_killed_work_horse_has_its_container_stopped_by_the_worker_and_is_not_retried(
        start_worker, redis_conn, fast_fleet, job_containers):
    worker = start_worker(*QUEUES, env=HOST)
    enqueue_spec(marked_spec("gh-horse-killed", body="fake-agent:sleep=60"), "pi-jobs")
    wait_for(lambda: job_containers("hostA").get("gh-horse-killed"), timeout=90, what="the job's container")

    os.kill(horse_of(worker.pid), 9)

    wait_for(lambda: "gh-horse-killed" not in job_containers(), timeout=30, what="the container to be stopped")
    (run,) = wait_for(lambda: runs("gh-horse-killed"), timeout=30, what="the record")
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.FAILED, "worker-lost", True)
    time.sleep(3)
    assert len(runs("gh-horse-killed")) == 1 and worker.alive()
    assert Job.fetch("gh-horse-killed", connection=redis_conn).get_status() == "failed"
    assert keys_holding(redis_conn) == []


def test_rqs_stop_command_stops_the_container_without_the_killed_horse(start_worker, redis_conn, fast_fleet,
                                                                      job_containers):
    start_worker(*QUEUES, env=HOST)
    enqueue_spec(marked_spec("gh-rq-stopped", body="fake-agent:sleep=60"), "pi-jobs")
    wait_for(lambda: job_containers("hostA").get("gh-rq-stopped"), timeout=90, what="the job's container")

    send_stop_job_command(redis_conn, "gh-rq-stopped")  # SIGKILLs the work horse

    wait_for(lambda: "gh-rq-stopped" not in job_containers(), timeout=30, what="the container to be stopped")
    (run,) = wait_for(lambda: runs("gh-rq-stopped"), timeout=30, what="the record")
    assert (run.outcome, run.reason, run.lost_retry) == (Outcome.POLICY, "operator-cancel", LostRetry.CANCELLED)
    wait_for(lambda: Job.fetch("gh-rq-stopped", connection=redis_conn).get_status() == "stopped", timeout=15,
             what="RQ to mark the job stopped")  # after the record and its status comment
    assert keys_holding(redis_conn) == []
