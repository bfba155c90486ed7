"""A job whose worker died is recorded `worker-lost` once and, by the lost-retry policy (PI_LOST_RETRIES, the
settings row over the environment, default 1), run again as its next attempt on the queue it came from: a
shared-queue job by any live host, a host-queue job only once its host is back. The retry holds its own dollar
cap and job-count slot; the lost attempt's hold stays charged. Off, used up or cancelled, it is not run again,
and the lost attempt's record says which, on the run page and in the API."""

import os
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from rq import Queue
from rq.job import Job
from rq.registry import StartedJobRegistry

from apps.fleet import cancel
from apps.worker.gates import budget
from apps.worker.models import DispatchSettings, LostRetry, Outcome, Run, ScopedLimit
from apps.worker.process import worker_lost
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import group_alive, horse_of

pytestmark = pytest.mark.django_db(transaction=True)

DOLLARS = {"PI_MAX_COST_USD": "2.5", "PI_DAILY_COST_USD": "10"}


def host_env(name, **extra):
    return {"PI_WORKER_NAME": name, **extra}


def runs(job_id):
    return list(Run.objects.filter(job_id=job_id).order_by("attempt"))


def dollars_today(redis) -> tuple[int, int]:
    """(used, held) micro-dollars of the deployment's dollar window today."""
    used, held = redis.hmget(budget.usd_window_keys("all", datetime.now(UTC))["day"], "used", "held")
    return int(used or 0), int(held or 0)


def runs_reserved_today(redis) -> int:
    return budget.deployment_counts(redis, datetime.now(UTC))["day"]


def rq_status(redis, job_id):
    return Job.fetch(job_id, connection=redis).get_status()


@pytest.mark.docker
def test_a_shared_queue_job_whose_host_was_killed_runs_again_on_another_host_and_pays_its_own_hold(
        start_worker, redis_conn, fast_fleet, job_containers):
    # One run of acme/web at a time, fleet-wide: the lost attempt's slot on hostB must not hold its retry back.
    ScopedLimit.objects.create(scope="acme/web", concurrent=1)
    host_b = start_worker("pi-jobs", "pi-jobs@hostB", env=host_env("hostB", **DOLLARS), name="hostB")
    job_id = enqueue_spec(forge_spec("gh-lost-shared", body="fake-agent:sleep=12"))
    wait_for(lambda: job_containers("hostB").get(job_id), timeout=90, what="the job's container on hostB")
    assert dollars_today(redis_conn) == (0, 2_500_000) and runs_reserved_today(redis_conn) == 1
    host_a = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA", **DOLLARS), name="hostA")
    wait_for(lambda: "Listening on" in host_a.output(), timeout=60, what="hostA to take work")

    host_b.kill()  # its horse dies with it; the engine keeps the container running

    lost, retry = wait_for(lambda: len(found := runs(job_id)) == 2 and found, timeout=120, what="the second attempt")
    assert (lost.attempt, lost.outcome, lost.reason, lost.host, lost.lost_retry) == (
        1, Outcome.FAILED, "worker-lost", "hostB", LostRetry.RETRIED)
    assert (retry.attempt, retry.outcome, retry.host, retry.queue) == (2, Outcome.COMPLETED, "hostA", "pi-jobs")
    # The lost attempt may have spent: its hold is charged whole. The retry held (and, the demo runner being
    # unmetered, was charged) its own. Two runs took two job-count slots, and nothing stays held.
    assert (lost.dollar_basis, lost.dollars_reserved, lost.dollars_charged) == ("floor", Decimal("2.5"), Decimal("2.5"))
    assert (retry.dollars_reserved, retry.dollars_charged) == (Decimal("2.5"), Decimal("2.5"))
    assert dollars_today(redis_conn) == (5_000_000, 0)
    assert runs_reserved_today(redis_conn) == 2
    # The run record is written by the horse before RQ marks the job finished.
    wait_for(lambda: rq_status(redis_conn, job_id) == "finished", timeout=15, what="RQ to learn the job finished")
    assert "job_lost_retried job=gh-lost-shared attempt=2 queue=pi-jobs" in host_a.output()


@pytest.mark.docker
def test_a_host_queue_job_whose_host_was_killed_waits_for_that_host_and_its_boot_reaper_removes_the_orphan(
        start_worker, redis_conn, fast_fleet, job_containers):
    host_a = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA"), name="hostA")
    host_b = start_worker("pi-jobs", "pi-jobs@hostB", env=host_env("hostB"), name="hostB")
    job_id = enqueue_spec(forge_spec("gh-lost-hosted", body="fake-agent:sleep=10"), "pi-jobs@hostB")
    wait_for(lambda: job_containers("hostB").get(job_id), timeout=90, what="the job's container on hostB")

    host_b.kill()
    wait_for(lambda: not group_alive(host_b.pid), timeout=30, what="hostB's horse and scheduler to die with it")

    # hostA's sweep settles it: recorded once, and back on hostB's own queue, where only hostB looks.
    (lost,) = wait_for(lambda: runs(job_id), timeout=60, what="hostA's sweep to settle the lost attempt")
    assert (lost.outcome, lost.reason, lost.host, lost.lost_retry) == (
        Outcome.FAILED, "worker-lost", "hostB", LostRetry.RETRIED)
    wait_for(lambda: Queue("pi-jobs@hostB", connection=redis_conn).get_job_ids() == [job_id], timeout=15,
             what="the job back on hostB's queue")
    time.sleep(3)
    assert len(runs(job_id)) == 1 and rq_status(redis_conn, job_id) == "queued"
    assert job_id in job_containers("hostB")  # the orphan still runs: only hostB's engine is hostB's business
    assert "job_lost_retried job=gh-lost-hosted attempt=2 queue=pi-jobs@hostB" in host_a.output()

    back = start_worker("pi-jobs", "pi-jobs@hostB", env=host_env("hostB"), name="hostB-back")

    wait_for(lambda: f"container_reaped job={job_id} host=hostB why=boot" in back.output(), timeout=60,
             what="hostB's boot reaper to remove the orphan")
    retry = wait_for(lambda: len(found := runs(job_id)) == 2 and found[1], timeout=120, what="the second attempt")
    assert (retry.attempt, retry.outcome, retry.host) == (2, Outcome.COMPLETED, "hostB")
    wait_for(lambda: rq_status(redis_conn, job_id) == "finished", timeout=15, what="RQ to learn the job finished")
    assert len(runs(job_id)) == 2


@pytest.mark.docker
def test_with_the_policy_off_a_lost_job_is_not_run_again_and_its_run_says_why(
        start_worker, redis_conn, fast_fleet, job_containers, admin_client):
    DispatchSettings.objects.create(lost_retries=0)  # the live row, over the environment's default of 1
    worker = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA"))
    job_id = enqueue_spec(forge_spec("gh-lost-off", body="fake-agent:sleep=60"))
    wait_for(lambda: job_containers("hostA").get(job_id), timeout=90, what="the job's container")

    os.kill(horse_of(worker.pid), 9)

    (run,) = wait_for(lambda: runs(job_id), timeout=30, what="the record")
    assert (run.outcome, run.reason, run.lost_retry) == (Outcome.FAILED, "worker-lost", LostRetry.OFF)
    wait_for(lambda: rq_status(redis_conn, job_id) == "failed", timeout=15, what="RQ to mark it failed")
    time.sleep(3)
    assert len(runs(job_id)) == 1 and worker.alive()

    said = "lost; not retried: runs after a lost worker are off (PI_LOST_RETRIES is 0)"
    assert said in admin_client.get(f"/admin/worker/run/{run.pk}/change/").content.decode()
    assert admin_client.get(f"/api/v1/runs/{run.pk}").json()["lost_retry_explained"] == said


@pytest.mark.docker
def test_a_job_lost_twice_is_run_again_only_as_often_as_the_policy_says(
        start_worker, redis_conn, fast_fleet, job_containers, admin_client):
    worker = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA"))
    job_id = enqueue_spec(forge_spec("gh-lost-twice", body="fake-agent:sleep=60"))
    first = wait_for(lambda: job_containers("hostA").get(job_id), timeout=90, what="the first attempt's container")

    os.kill(horse_of(worker.pid), 9)
    wait_for(lambda: (c := job_containers("hostA").get(job_id)) and c.id != first.id, timeout=90,
             what="the second attempt's container")
    os.kill(horse_of(worker.pid), 9)

    lost, lost_again = wait_for(lambda: len(found := runs(job_id)) == 2 and found, timeout=30, what="two records")
    assert (lost.attempt, lost.reason, lost.lost_retry) == (1, "worker-lost", LostRetry.RETRIED)
    assert (lost_again.attempt, lost_again.reason, lost_again.lost_retry) == (2, "worker-lost", LostRetry.USED_UP)
    wait_for(lambda: rq_status(redis_conn, job_id) == "failed", timeout=15, what="RQ to mark it failed")
    time.sleep(3)
    assert len(runs(job_id)) == 2

    page = admin_client.get(f"/admin/worker/run/{lost.pk}/change/").content.decode()
    assert "lost; retried as attempt 2" in page
    assert admin_client.get(f"/api/v1/runs/{lost_again.pk}").json()["lost_retry_explained"] == (
        "lost; not retried: its runs after a lost worker are used up (PI_LOST_RETRIES)")


@pytest.mark.docker
def test_a_lost_attempt_leaves_the_job_its_infrastructure_retries(start_worker, redis_conn, fast_fleet,
                                                                  job_containers):
    worker = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA"))
    job_id = enqueue_spec(forge_spec("gh-lost-then-faulty", body="fake-agent:sleep=4 fake-agent:exit=1"))
    wait_for(lambda: job_containers("hostA").get(job_id), timeout=90, what="the first attempt's container")

    os.kill(horse_of(worker.pid), 9)

    found = wait_for(lambda: len(found := runs(job_id)) == 3 and found, timeout=120, what="three attempts")
    assert [(run.attempt, run.reason, run.lost_retry) for run in found] == [
        (1, "worker-lost", LostRetry.RETRIED), (2, "runner-infra", ""), (3, "runner-infra", "")]
    wait_for(lambda: rq_status(redis_conn, job_id) == "failed", timeout=15, what="RQ to mark it failed")
    time.sleep(3)
    assert len(runs(job_id)) == 3  # PI_RETRY_ATTEMPTS (2) faults, and the lost attempt besides


@pytest.mark.docker
def test_a_job_its_operator_cancelled_while_its_worker_was_lost_is_not_run_again(
        start_worker, redis_conn, fast_fleet, job_containers):
    first = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA"), name="first")
    job_id = enqueue_spec(forge_spec("gh-lost-cancelled", body="fake-agent:sleep=60"), "pi-jobs@hostA")
    wait_for(lambda: job_containers("hostA").get(job_id), timeout=90, what="the job's container")
    first.kill()
    wait_for(lambda: not group_alive(first.pid), timeout=30, what="its horse to die with it")

    # The operator cancels it while no worker watches it; the worker comes back while the cancel waits.
    answers = []
    asking = threading.Thread(target=lambda: answers.append(cancel.cancel_job(redis_conn, job_id, by="operator",
                                                                               ack_seconds=60)))
    asking.start()
    wait_for(lambda: cancel.is_cancel_requested(job_id, redis_conn), timeout=10, what="the cancel request")
    restarted = start_worker("pi-jobs", "pi-jobs@hostA", env=host_env("hostA"), name="restarted")

    (run,) = wait_for(lambda: runs(job_id), timeout=60, what="the boot reaper to settle it")
    assert (run.outcome, run.reason, run.lost_retry) == (Outcome.POLICY, "operator-cancel", LostRetry.CANCELLED)
    asking.join(timeout=90)
    assert rq_status(redis_conn, job_id) == "failed"
    time.sleep(3)
    assert len(runs(job_id)) == 1 and "job_lost_retried" not in restarted.output()


def test_every_settler_of_one_lost_attempt_records_it_once_and_puts_it_back_once(redis_conn):
    """RQ's abandoned-job cleanup and a sweep (or boot reaper) that read the same job as started race: one
    record, one retry on the queue it came from."""
    job_id = enqueue_spec(forge_spec("gh-lost-race"), "pi-jobs@hostB")
    queue = Queue("pi-jobs@hostB", connection=redis_conn)
    job = queue.fetch_job(job_id)
    redis_conn.lrem(queue.key, 0, job_id)  # popped by hostB's worker, which then died
    job.set_status("started")
    job.worker_name = "gone"
    job.save()
    started = StartedJobRegistry(queue.name, connection=redis_conn)
    redis_conn.zadd(started.key, {f"{job_id}:dead-execution": time.time() - 60})  # its heartbeat ran out
    seen_by_the_sweep = Job.fetch(job_id, connection=redis_conn)

    started.cleanup(exception_handlers=[worker_lost.abandoned_job_handler])
    assert worker_lost.settle(seen_by_the_sweep, host="hostB", settled_by="sweep") is False

    (run,) = runs(job_id)
    assert (run.attempt, run.reason, run.lost_retry) == (1, "worker-lost", LostRetry.RETRIED)
    assert queue.get_job_ids() == [job_id]
    back = Job.fetch(job_id, connection=redis_conn)
    assert back.get_status() == "queued" and back.number_of_retries == 1  # its next attempt is attempt 2
    assert redis_conn.zcard(started.key) == 0 and redis_conn.zcard(f"rq:failed:{queue.name}") == 0


def test_settling_a_lost_attempt_whose_execution_record_expired_ends_it_and_the_sweeper_lives(redis_conn):
    """A host back from a long cut: its job's execution record expired in Redis while the started registry still
    names it. RQ's own removal reads that record and raises; the settler removes the entry by its id and goes on."""
    from rq.executions import Execution

    job_id = enqueue_spec(forge_spec("gh-lost-expired"))
    job = Job.fetch(job_id, connection=redis_conn)
    with redis_conn.pipeline() as pipe:
        execution = Execution.create(job, ttl=60, pipeline=pipe, worker_name="gone")
        pipe.execute()
    redis_conn.delete(execution.key)  # expired while its worker was cut off
    registry = StartedJobRegistry("pi-jobs", connection=redis_conn)
    assert registry.get_job_ids() == [job_id]
    with pytest.raises(ValueError):  # what killed the sweeping worker in the cut-off drill
        registry.remove_executions(job)

    assert worker_lost.settle(job, host="hostB", settled_by="test")

    assert registry.get_job_ids() == []
    assert [(run.attempt, run.reason, run.lost_retry) for run in runs(job_id)] == [(1, "worker-lost", "retried")]
