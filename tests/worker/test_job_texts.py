"""An ended job's copy in Redis keeps none of its texts (title, body, comment, instructions, task, the event
context), whatever its end: refused, completed, failed after its retries, raised. RQ keeps a failed job for
days; only a job that still has an attempt to come (deferred, retried) keeps them. No log record carries
them either: RQ attaches a job's arguments to the record of one that raised, this worker does not. (Lost,
stopped and cancelled jobs: tests/worker/test_worker_process_lost.py and tests/fleet/test_fleet_cancel.py.)"""

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from rq.job import Job

from apps.worker.models import Outcome, Run
from tests.conftest import ROOT
from tests.jobspecs import MARKER, enqueue_spec, keys_holding, marked_spec

pytestmark = pytest.mark.django_db(transaction=True)


def stored_payload(redis_conn, job_id: str) -> dict:
    return Job.fetch(job_id, connection=redis_conn).args[0]


def assert_forgotten(redis_conn, job_id: str) -> None:
    """The job is still in Redis (RQ keeps it), readable, and nothing in Redis holds its texts."""
    payload = stored_payload(redis_conn, job_id)
    assert {name: payload[name] for name in ("title", "body", "comment", "instructions", "task", "context")} == {
        "title": "", "body": "", "comment": "", "instructions": "", "task": "", "context": {}}
    assert (payload["repo"], payload["number"]) == ("acme/web", 7)  # the target stays for the fleet panel
    assert keys_holding(redis_conn) == []


def test_a_refused_job_keeps_no_text(redis_conn, run_worker):
    job_id = enqueue_spec(marked_spec("gh-texts-refused"))

    run_worker("pi-jobs", env_overrides={"ANTHROPIC_API_KEY": ""})

    assert Run.objects.get(job_id=job_id).reason == "provider-unconfigured"
    assert Job.fetch(job_id, connection=redis_conn).get_status() == "finished"
    assert_forgotten(redis_conn, job_id)


@pytest.mark.docker
def test_a_completed_job_keeps_no_text(redis_conn, run_worker):
    job_id = enqueue_spec(marked_spec("gh-texts-completed", body="fake-agent:report"))

    run_worker("pi-jobs")

    assert Run.objects.get(job_id=job_id).outcome == Outcome.COMPLETED
    assert_forgotten(redis_conn, job_id)


def test_a_retried_job_keeps_its_texts_until_its_last_attempt_fails(redis_conn, run_worker):
    job_id = enqueue_spec(marked_spec("gh-texts-retried"))
    no_engine = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}

    run_worker("pi-jobs", env_overrides=no_engine)
    assert Job.fetch(job_id, connection=redis_conn).get_status() == "scheduled"
    assert keys_holding(redis_conn) == [f"rq:job:{job_id}"]  # the next attempt needs them

    time.sleep(1.5)  # PI_RETRY_BACKOFF_SECONDS=1
    run_worker("pi-jobs", env_overrides=no_engine)

    assert [run.reason for run in Run.objects.filter(job_id=job_id).order_by("attempt")] == [
        "docker-unavailable", "docker-unavailable"]
    assert Job.fetch(job_id, connection=redis_conn).get_status() == "failed"
    assert_forgotten(redis_conn, job_id)


def test_a_deferred_job_keeps_its_texts(redis_conn, run_worker):
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    job_id = enqueue_spec(marked_spec("gh-texts-deferred", wait_for=({"after": later},)))

    run_worker("pi-jobs")

    assert Job.fetch(job_id, connection=redis_conn).get_status() == "scheduled"
    assert stored_payload(redis_conn, job_id)["title"] == f"{MARKER} title"


# Every log record any process of this worker creates (its work horses are forks), attributes and all.
SPIED_WORKER = """
import json, logging, sys
records = open(sys.argv[1], "a", buffering=1)
handle = logging.Logger.handle
def spied(self, record):
    records.write(json.dumps({name: repr(value) for name, value in vars(record).items()}) + "\\n")
    return handle(self, record)
logging.Logger.handle = spied
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "rqworker", "pi-jobs", "--burst"])
"""


def test_a_job_that_raised_keeps_no_text_and_no_log_record_carries_it(redis_conn, worker_env, tmp_path):
    job_id = enqueue_spec(marked_spec("gh-texts-raised"))
    log = tmp_path / "records.jsonl"

    # A job user of uid 0 is our own bug to report, not a refusal: the ladder raises (worker-error).
    subprocess.run([sys.executable, "-c", SPIED_WORKER, str(log)], cwd=ROOT, env={**worker_env, "PI_JOB_USER": "0:0"},
                   capture_output=True, timeout=120, check=True)

    assert Run.objects.get(job_id=job_id).reason == "worker-error"
    assert Job.fetch(job_id, connection=redis_conn).get_status() == "failed"
    assert_forgotten(redis_conn, job_id)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert any("exception raised while executing" in record["msg"] for record in records)  # RQ's handler ran
    assert [record for record in records if MARKER in json.dumps(record)] == []
    assert [record["msg"] for record in records if "arguments" in record or "kwargs" in record] == []
