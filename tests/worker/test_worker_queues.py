"""Plain `manage.py rqworker pi-jobs pi-jobs@<host>` works for any valid host name, with no settings edit."""

import pytest
from rq import Queue

from apps.fleet.queues import QueueConfigMap, host_of_queue, host_queue
from apps.worker.jobs import JobSpec, enqueue
from apps.worker.models import Outcome, Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def spec(job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, kind="github", repo="acme/web", target_type="issue", number=3, flow="fix")


@pytest.mark.parametrize("host", ["hostA", "build-07.eu_west", "x"])
def test_a_worker_drains_its_host_queue_and_records_the_host(run_worker, host):
    enqueue(spec("gh-host-job"), host_queue(host))
    enqueue(spec("gh-shared-job"), "pi-jobs")

    run_worker("pi-jobs", host_queue(host))

    host_run = Run.objects.get(job_id="gh-host-job")
    assert (host_run.outcome, host_run.host, host_run.queue) == (Outcome.COMPLETED, host, host_queue(host))
    assert Run.objects.get(job_id="gh-shared-job").queue == "pi-jobs"


def test_a_worker_without_the_host_queue_leaves_host_jobs_alone(run_worker, redis_conn):
    enqueue(spec("gh-for-hostB"), host_queue("hostB"))

    run_worker("pi-jobs", host_queue("hostA"))

    assert not Run.objects.filter(job_id="gh-for-hostB").exists()
    assert Queue(host_queue("hostB"), connection=redis_conn).get_job_ids() == ["gh-for-hostB"]


def test_a_worker_named_differently_from_its_host_queue_refuses_to_start(run_worker):
    result = run_worker("pi-jobs", host_queue("hostA"), env_overrides={"PI_WORKER_NAME": "hostB"}, check=False)

    assert result.returncode != 0
    assert "PI_WORKER_NAME=hostB" in result.stderr and "pi-jobs@hostB" in result.stderr


def test_a_worker_refuses_a_queue_that_is_not_ours(run_worker):
    result = run_worker("pi-jobs@bad@name", check=False)

    assert result.returncode != 0
    assert "'pi-jobs@bad@name' is not a pidispatch queue" in result.stderr


def test_queue_config_answers_for_every_valid_host_queue():
    queues = QueueConfigMap({"URL": "redis://example:6379/0"})

    assert queues["pi-jobs@hostA"] is queues["pi-jobs"]
    assert "pi-jobs@some.host-1" in queues
    assert list(queues) == ["pi-jobs"]  # listings show only the shared queue
    for bad in ("default", "pi-jobs@", "pi-jobs@-lead", "pi-jobs@a@b", "pi-jobs@" + "x" * 65):
        assert bad not in queues
        with pytest.raises(KeyError):
            queues[bad]


def test_host_queue_names_split_unambiguously():
    assert host_queue("hostA") == "pi-jobs@hostA"
    assert host_of_queue("pi-jobs@hostA") == "hostA"
    assert host_of_queue("pi-jobs") is None
    with pytest.raises(ValueError):
        host_queue("bad name")
