"""Cancel any job by id, in any state, on any host: waiting jobs are removed without a run record, a
running job's container is stopped by the worker that owns it, and a request no worker acknowledges stays
pending for the worker to carry out when it comes back (tests/hosts/ cuts a host off to prove it)."""

import time

import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from apps.fleet import cancel, status, waiting
from apps.fleet.models import FleetAction
from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec, keys_holding, marked_spec

pytestmark = [pytest.mark.django_db(transaction=True)]


def gone(redis_conn, job_id):
    return not redis_conn.exists(Job.key_for(job_id))


def test_a_queued_job_is_removed_and_never_runs(redis_conn, fleet_command, run_worker):
    enqueue_spec(forge_spec("gh-unwanted", body="secret issue text"), "pi-jobs")

    result = fleet_command("cancel", "gh-unwanted", "--by", "ops")

    assert result.returncode == 0, result.stderr
    assert "removed queued job gh-unwanted from pi-jobs" in result.stdout
    assert Queue("pi-jobs", connection=redis_conn).get_job_ids() == [] and gone(redis_conn, "gh-unwanted")
    assert cancel.is_cancel_requested("gh-unwanted")
    run_worker("pi-jobs")
    assert not Run.objects.filter(job_id="gh-unwanted").exists()
    action = FleetAction.objects.get(action="cancel")
    assert (action.job_id, action.actor, action.queues) == ("gh-unwanted", "ops", ["pi-jobs"])


def test_a_deferred_job_is_removed_with_its_note(redis_conn, run_worker, fleet_command):
    Queue("pi-jobs", connection=redis_conn).enqueue_call("tests.jobfuncs.defer_once", args=(30,), job_id="defer-me")
    run_worker("pi-jobs")
    (held,) = status.snapshot(redis_conn).waiting
    assert (held.job_id, held.kind, held.reason) == ("defer-me", "deferred", "test")

    result = fleet_command("cancel", "defer-me")

    assert result.returncode == 0, result.stderr
    assert "removed deferred job defer-me" in result.stdout
    assert ScheduledJobRegistry("pi-jobs", connection=redis_conn).get_job_ids(cleanup=False) == []
    assert not redis_conn.exists(waiting.note_key("defer-me")) and gone(redis_conn, "defer-me")
    assert status.snapshot(redis_conn).waiting == []


def test_a_finished_or_unknown_job_changes_nothing(redis_conn, fleet_command):
    job = Queue("pi-jobs", connection=redis_conn).enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id="done-1")
    job.set_status(JobStatus.FINISHED)

    ended = fleet_command("cancel", "done-1")
    unknown = fleet_command("cancel", "gh-never-was")
    invalid = fleet_command("cancel", "not a job/id")

    assert ended.returncode == 0 and "already ended (finished); nothing was changed" in ended.stdout
    assert not cancel.is_cancel_requested("done-1")
    assert unknown.returncode == 0 and "no job gh-never-was in Redis" in unknown.stdout
    assert invalid.returncode != 0 and "is not a job id" in invalid.stderr
    assert not FleetAction.objects.exists()


def test_a_cancel_no_worker_acknowledges_stays_pending_for_its_worker(redis_conn, fleet_command):
    queue = Queue("pi-jobs", connection=redis_conn)
    job = queue.enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id="gh-stuck")
    redis_conn.lpop(queue.key)  # taken by a worker that is not watching (its host is unreachable)
    job.set_status(JobStatus.STARTED)

    started = time.monotonic()
    result = fleet_command("cancel", "gh-stuck", env={"PI_FLEET_CANCEL_ACK_SECONDS": "2"})

    assert result.returncode == 0, result.stderr
    assert "no worker acknowledged the cancel of running job gh-stuck within 2 s" in result.stdout
    assert "the request stays" in result.stdout and time.monotonic() - started < 30
    assert cancel.is_cancel_requested("gh-stuck")  # what its worker, and the gates of any later attempt, will see
    assert Job.fetch("gh-stuck", connection=redis_conn).get_status() == JobStatus.STARTED
    assert FleetAction.objects.filter(action="cancel", job_id="gh-stuck").exists()


@pytest.mark.docker
def test_a_running_job_on_another_host_is_stopped_by_its_worker(start_worker, redis_conn, fast_fleet, fleet_command,
                                                              job_containers):
    start_worker("pi-jobs", "pi-jobs@hostA", env={"PI_WORKER_NAME": "hostA"}, name="hostA")
    start_worker("pi-jobs", "pi-jobs@hostB", env={"PI_WORKER_NAME": "hostB"}, name="hostB")
    enqueue_spec(forge_spec("gh-cancel-me", body="fake-agent:sleep=60"), "pi-jobs@hostB")

    def running_container():  # the worker creates the container, then starts it: wait for both
        container = job_containers("hostB").get("gh-cancel-me")
        if container is not None:
            container.reload()
            return container if container.status == "running" else None
        return None

    wait_for(running_container, timeout=90, what="hostB's running container")

    asked = time.monotonic()
    result = fleet_command("cancel", "gh-cancel-me")

    assert result.returncode == 0, result.stderr
    assert "acknowledged by the worker on host hostB" in result.stdout
    wait_for(lambda: "gh-cancel-me" not in job_containers(), timeout=30, what="the container to be stopped")
    assert time.monotonic() - asked < 30  # SIGTERM, then SIGKILL after 5 s: seconds, not the job's 60
    wait_for(lambda: Run.objects.filter(job_id="gh-cancel-me").exists(), timeout=30, what="the run record")
    time.sleep(3)  # a retry would be back within a second: a cancelled job is never retried
    assert Run.objects.filter(job_id="gh-cancel-me").count() == 1
    assert Job.fetch("gh-cancel-me", connection=redis_conn).get_status() in (JobStatus.FAILED, JobStatus.FINISHED)


@pytest.mark.docker
def test_a_cancelled_running_job_is_recorded_operator_cancel(start_worker, redis_conn, fast_fleet, job_containers):
    start_worker("pi-jobs")
    enqueue_spec(marked_spec("gh-cancel-record", body="fake-agent:sleep=60"), "pi-jobs")
    wait_for(lambda: job_containers().get("gh-cancel-record"), timeout=90, what="the container")

    assert cancel.cancel_job(redis_conn, "gh-cancel-record", by="test").outcome == "stopping"

    run = wait_for(lambda: Run.objects.filter(job_id="gh-cancel-record").first(), timeout=60, what="the record")
    assert (run.outcome, run.reason) == (Outcome.POLICY, "operator-cancel")
    wait_for(lambda: Job.fetch("gh-cancel-record", connection=redis_conn).get_status() in ("finished", "failed"),
             timeout=30, what="RQ to end the job")
    assert keys_holding(redis_conn) == []  # what RQ keeps of the cancelled job holds none of its texts


@pytest.mark.docker
def test_a_job_cancelled_as_it_is_taken_never_starts_a_container(redis_conn, run_worker, job_containers):
    enqueue_spec(forge_spec("gh-slipped"), "pi-jobs")
    redis_conn.hset(cancel.request_key("gh-slipped"), mapping={"by": "test", "at": "now", "state": "removed"})

    run_worker("pi-jobs")

    run = Run.objects.get(job_id="gh-slipped")
    assert (run.outcome, run.reason, run.budget_reserved) == (Outcome.POLICY, "operator-cancel", False)
