"""Two real worker hosts, hostA and hostB, on one Redis: host-affine jobs reach only their host, pause and
resume over the queue union reach both, and a dead host's paused queue stays listed and resumable."""

import json
import time

import pytest
from rq import Queue

from apps.worker.models import Outcome, Run
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import host_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

QUIET_SECONDS = 3  # long enough for several pause checks of a worker (each about a second)


def status(fleet_command) -> dict:
    result = fleet_command("status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_of(job_id):
    return Run.objects.filter(job_id=job_id).first()


@pytest.fixture
def two_hosts(start_worker, redis_conn, fast_fleet):
    workers = {
        name: start_worker("pi-jobs", f"pi-jobs@{name}", env={"PI_WORKER_NAME": name}, name=name)
        for name in ("hostA", "hostB")
    }
    for name in workers:
        wait_for(lambda name=name: (row := host_row(redis_conn, name)) and row.liveness == "live", timeout=60,
                 what=f"{name}'s registry row")
    return workers


def test_host_affine_jobs_reach_only_their_host(two_hosts):
    for index in range(2):
        enqueue_spec(forge_spec(f"gh-for-a-{index}"), "pi-jobs@hostA")
        enqueue_spec(forge_spec(f"gh-for-b-{index}"), "pi-jobs@hostB")

    for index in range(2):
        for host in ("a", "b"):
            run = wait_for(lambda host=host, index=index: run_of(f"gh-for-{host}-{index}"), timeout=120,
                           what="the host job's run")
            assert run.outcome == Outcome.COMPLETED
            assert (run.host, run.queue) == (f"host{host.upper()}", f"pi-jobs@host{host.upper()}")


def test_pause_all_stops_both_hosts_and_resume_all_starts_them(two_hosts, fleet_command, redis_conn):
    paused = fleet_command("pause", "--all", "--note", "provider outage")
    assert paused.returncode == 0, paused.stderr
    assert "paused 3 queue(s): pi-jobs, pi-jobs@hostA, pi-jobs@hostB" in paused.stdout
    time.sleep(QUIET_SECONDS)
    for queue, job_id in (("pi-jobs", "gh-during-pause"), ("pi-jobs@hostA", "gh-a-during-pause"),
                          ("pi-jobs@hostB", "gh-b-during-pause")):
        enqueue_spec(forge_spec(job_id), queue)

    time.sleep(QUIET_SECONDS)
    assert Run.objects.count() == 0
    snapshot = status(fleet_command)
    assert snapshot["state"] == "PAUSED" and snapshot["totals"]["queued"] == 3
    flags = {q["name"]: q["pause"] for q in snapshot["queues"]}
    assert all(flag["note"] == "provider outage" and flag["by"].startswith("cli:") for flag in flags.values())
    assert all(worker.alive() for worker in two_hosts.values())

    resumed = fleet_command("resume", "--all")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed 3 queue(s)" in resumed.stdout

    assert wait_for(lambda: run_of("gh-a-during-pause"), timeout=120, what="hostA's job").host == "hostA"
    assert wait_for(lambda: run_of("gh-b-during-pause"), timeout=120, what="hostB's job").host == "hostB"
    assert wait_for(lambda: run_of("gh-during-pause"), timeout=120, what="the shared job").outcome == Outcome.COMPLETED
    assert status(fleet_command)["state"] == "RUNNING"


def test_a_dead_hosts_paused_queue_stays_listed_and_resume_all_resumes_it(two_hosts, fleet_command, redis_conn,
                                                                         admin_client):
    assert fleet_command("pause", "--host", "hostB", "--note", "disk swap").returncode == 0
    two_hosts["hostB"].kill()
    wait_for(lambda: host_row(redis_conn, "hostB").liveness == "gone", timeout=30, what="hostB's row to expire")
    enqueue_spec(forge_spec("gh-stranded"), "pi-jobs@hostB")

    snapshot = status(fleet_command)
    queues = {q["name"]: q for q in snapshot["queues"]}
    assert queues["pi-jobs@hostB"]["paused"] and queues["pi-jobs@hostB"]["pause"]["note"] == "disk swap"
    assert queues["pi-jobs@hostB"]["queued"] == 1
    assert not queues["pi-jobs@hostA"]["paused"]
    assert snapshot["state"] == "PART PAUSED"
    assert {h["name"]: h["liveness"] for h in snapshot["hosts"]} == {"hostA": "live", "hostB": "gone"}
    text = fleet_command("status").stdout
    assert "pi-jobs@hostB  paused" in text and "disk swap" in text

    page = admin_client.get("/admin/fleet/fleetpanel/").content.decode()
    assert 'data-queue="pi-jobs@hostB"' in page and "PART PAUSED" in page
    assert page.split('data-queue="pi-jobs@hostB"')[1].split("</tr>")[0].count("paused") >= 1

    resumed = fleet_command("resume", "--all")
    assert resumed.returncode == 0, resumed.stderr
    assert "pi-jobs@hostB" in resumed.stdout
    assert status(fleet_command)["state"] == "RUNNING"
    assert Queue("pi-jobs@hostB", connection=redis_conn).get_job_ids() == ["gh-stranded"]  # waits for its host
