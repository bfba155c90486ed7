"""A Redis outage while a job runs is ridden out for PI_REDIS_OUTAGE_SECONDS: the worker lives, the job
finishes and is recorded, RQ learns of it once Redis is back. Past that the job is given up, container
and all. And whatever became of its worker, a container past its deadline label is stopped by any
worker's sweep on its host.

The tests' own Redis serves the whole session, so these run their worker against a private redis-server
(persistent, like production's) that they stop and start again."""

import time

import docker
import pytest
from rq.job import Job

from apps.fleet.connection import get_redis
from apps.worker.models import Outcome, Run
from apps.worker.sandbox.container import HOST_LABEL, JOB_LABEL
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import PrivateRedis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

HOST = {"PI_WORKER_NAME": "hostA"}
QUEUES = ("pi-jobs", "pi-jobs@hostA")
DEADLINE_LABEL = "pidispatch.deadline"  # part of the container contract: any worker reads it


@pytest.fixture
def private_redis(tmp_path, settings):
    redis = PrivateRedis(tmp_path / "redis")
    settings.REDIS_URL = redis.url  # this test enqueues and reads there too
    yield redis
    redis.stop()


def runs(job_id):
    return list(Run.objects.filter(job_id=job_id).order_by("attempt"))


def rq_status(job_id):
    return Job.fetch(job_id, connection=get_redis()).get_status()


# The agent's sleep, ended from outside: the job then completes as if it had slept its time. The image has no
# pkill, so the shell finds the process by name.
END_AGENT_SLEEP = ('for p in /proc/[0-9]*; do [ "$(cat "$p/comm" 2>/dev/null)" = sleep ] '
                   '&& kill "${p#/proc/}"; done; true')


def running_container(job_id, job_containers):
    container = job_containers("hostA").get(job_id)
    return container if container is not None and container.status == "running" else None


def agent_ended(job_id, job_containers) -> bool:
    """Ends the job's agent if it still sleeps; True once its container no longer runs."""
    container = job_containers("hostA").get(job_id)
    if container is None or container.status != "running":
        return True
    container.exec_run(["sh", "-c", END_AGENT_SLEEP])
    return False


def test_a_redis_outage_mid_job_is_ridden_out_and_the_job_finishes_recorded(
        private_redis, start_worker, fast_fleet, job_containers, settings):
    worker = start_worker(*QUEUES, env={**HOST, "REDIS_URL": private_redis.url, "PI_REDIS_OUTAGE_SECONDS": "30"})
    # The agent sleeps until the test ends it, so the outage begins while it runs on any machine, however slow.
    enqueue_spec(forge_spec("gh-redis-blip", body="fake-agent:sleep=600"), "pi-jobs")
    running = wait_for(lambda: running_container("gh-redis-blip", job_containers), timeout=90,
                       what="the job's container to run")
    deadline = int(running.labels[DEADLINE_LABEL])
    assert abs(deadline - (time.time() + settings.PI_JOB_TIMEOUT_SECONDS)) < 30

    private_redis.stop()
    wait_for(lambda: "redis_unreachable" in worker.output(), timeout=15, what="the worker to notice the outage")
    wait_for(lambda: agent_ended("gh-redis-blip", job_containers), timeout=20,
             what="the job's container to end while Redis is gone")
    assert worker.alive(), worker.output()
    private_redis.start()

    (run,) = wait_for(lambda: runs("gh-redis-blip"), timeout=30, what="the record")
    assert (run.outcome, run.attempt) == (Outcome.COMPLETED, 1)
    wait_for(lambda: rq_status("gh-redis-blip") == "finished", timeout=30, what="RQ to learn the job finished")
    assert worker.alive() and len(runs("gh-redis-blip")) == 1
    # The horse writes the result; the worker's own loop notes Redis back on its next call to it, which can come
    # a moment after the result is visible.
    wait_for(lambda: "redis_restored" in worker.output(), timeout=15, what="the worker to log Redis restored")
    assert "raised an exception" not in worker.output()  # neither the worker nor its scheduler gave up


def test_an_outage_longer_than_a_job_rides_out_stops_its_container_and_records_it(
        private_redis, start_worker, fast_fleet, job_containers):
    worker = start_worker(*QUEUES, env={**HOST, "REDIS_URL": private_redis.url, "PI_REDIS_OUTAGE_SECONDS": "2"})
    enqueue_spec(forge_spec("gh-redis-gone", body="fake-agent:sleep=120"), "pi-jobs")
    wait_for(lambda: job_containers("hostA").get("gh-redis-gone"), timeout=90, what="the job's container")

    private_redis.stop()

    wait_for(lambda: "gh-redis-gone" not in job_containers(), timeout=30, what="the worker to stop the container")
    (run,) = wait_for(lambda: runs("gh-redis-gone"), timeout=10, what="the record")
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.FAILED, "worker-lost", True)
    wait_for(lambda: not worker.alive(), timeout=30, what="the worker to quit")
    assert "job_given_up job=gh-redis-gone why=redis-unavailable" in worker.output()


def test_a_container_past_its_deadline_is_stopped_by_any_worker_on_its_host(start_worker, fast_fleet,
                                                                           job_containers, settings):
    worker = start_worker(*QUEUES, env=HOST)
    wait_for(lambda: "Listening on" in worker.output(), timeout=60, what="the worker to take work")
    engine = docker.from_env()
    now = int(time.time())

    def stray(job_id, host, deadline):
        container = engine.containers.create(
            settings.PI_JOB_IMAGE, entrypoint=["sleep", "600"], name=f"pi-job-{job_id}", network_mode="none",
            labels={JOB_LABEL: job_id, HOST_LABEL: host, DEADLINE_LABEL: str(deadline)})
        try:
            container.start()
        except docker.errors.APIError:
            # The sweep may take an overdue container between its creation and its start: that is its job (the
            # engine may still list it, marked for removal, for a moment).
            assert deadline < now, f"{job_id} could not start"
            wait_for(lambda: job_id not in job_containers(), timeout=10, what=f"{job_id} removed by the sweep")

    stray("gh-overdue", "hostA", now - 3600)  # nobody watches it: its worker would have stopped it long ago
    stray("gh-in-time", "hostA", now + 3600)
    stray("gh-elsewhere", "hostB", now - 3600)  # another host's engine is another host's business

    wait_for(lambda: "gh-overdue" not in job_containers(), timeout=30, what="the sweep to stop the overdue one")
    assert {"gh-in-time", "gh-elsewhere"} <= set(job_containers())
    assert "container_reaped job=gh-overdue host=hostA why=overdue" in worker.output()


def test_a_job_taken_the_instant_redis_goes_away_still_reaches_its_horse(private_redis, monkeypatch, settings):
    """Between leaving its queue and its horse's start a job is in no registry: a worker that died there on a
    Redis error would lose it unseen (the fleet drill caught one). The horse's own ladder rides the outage out
    (the test above); this is the moment before it, run in-process up to RQ's fork."""
    from rq import Queue, Worker

    from apps.fleet import hosts
    from apps.worker.process.rqworker import DispatchWorker

    settings.PI_WORKER_NAME = "hostA"
    monkeypatch.setattr(hosts, "_declared_by_queue", None)  # the worker declares its host: undone after the test
    connection = get_redis()
    worker = DispatchWorker([Queue(name, connection=connection) for name in QUEUES], connection=connection)
    enqueue_spec(forge_spec("gh-taken-at-the-edge"), "pi-jobs")
    job, queue = Queue.dequeue_any(worker.queues, None, connection=connection)
    handed = []
    monkeypatch.setattr(Worker, "execute_job", lambda self, job, queue: handed.append(job.id))

    private_redis.stop()
    worker.execute_job(job, queue)

    assert handed == ["gh-taken-at-the-edge"]
    assert worker.cancel_watch.job_id is None  # its watch was set and let go again, looking once more next tick
