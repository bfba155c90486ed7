"""PI_CONCURRENCY caps the containers one host runs at once, below its worker processes: a job past the cap
defers `host-busy` (never refused); the cap is live from the admin's settings row on every host, the fleet
panel shows it, a lowered cap counts the slots still held, and a crashed work horse's slot is taken over."""

import json
import os

import pytest
from django.core.exceptions import ValidationError
from rq import Queue

from apps.worker.gates import leases
from apps.worker.models import DispatchSettings, Outcome, Run
from apps.worker.validators import validate_dispatch_settings
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.process_support import ContainerLifetimes, assert_no_overlap, horse_of, host_row

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS_PAGE = "/admin/worker/dispatchsettings/"


def pool(start_worker, redis_conn, host, processes, **env):
    start_worker("pi-jobs", f"pi-jobs@{host}", pool=processes, name=host,
                 env={"PI_WORKER_NAME": host, "PI_SCOPE_BUSY_RECHECK_SECONDS": "1", **env})
    wait_for(lambda: (row := host_row(redis_conn, host)) and len(row.processes) == processes, timeout=90,
             what=f"{host}'s {processes} processes in the registry")


def panel_row(admin_client, host):
    page = admin_client.get("/admin/fleet/fleetpanel/").content.decode()
    return page.split(f'data-host="{host}"')[1].split("</tr>")[0]


def completed(job_ids):
    return Run.objects.filter(job_id__in=job_ids, outcome=Outcome.COMPLETED).count() == len(job_ids)


def test_a_lowered_ceiling_counts_the_slots_still_held_above_it(redis_conn):
    queue = Queue("pi-jobs", connection=redis_conn)
    for job_id in ("run-a", "run-b", "run-c"):
        queue.enqueue_call("tests.jobfuncs.defer_once", args=(1,), job_id=job_id).set_status("started")
    held = [leases.acquire(redis_conn, "h:test", 3, f"hostT#{job_id}", ttl_seconds=60)
            for job_id in ("run-a", "run-b", "run-c")]
    assert all(held) and len({lease.key for lease in held}) == 3

    leases.release(redis_conn, next(lease for lease in held if lease.key.endswith(":0")))
    # Slot 0 is free, but two running jobs hold slots 1 and 2 under the old ceiling of 3.
    assert leases.acquire(redis_conn, "h:test", 1, "hostT#run-d", ttl_seconds=60) is None
    for lease in held:
        leases.release(redis_conn, lease)
    assert leases.acquire(redis_conn, "h:test", 1, "hostT#run-d", ttl_seconds=60) is not None


def test_the_settings_row_takes_a_concurrency_of_at_least_one():
    with pytest.raises(ValidationError) as refused:
        validate_dispatch_settings(DispatchSettings(concurrency=0), fields=True)
    assert "concurrency" in refused.value.message_dict


def test_a_cap_of_one_runs_one_container_at_a_time_on_three_processes(start_worker, redis_conn, fast_fleet,
                                                                     admin_client, fleet_command):
    lifetimes = ContainerLifetimes()
    pool(start_worker, redis_conn, "hostC", 3, PI_CONCURRENCY="1")
    jobs = [enqueue_spec(forge_spec(f"gh-cap-{i}", number=20 + i, body="fake-agent:sleep=2"), "pi-jobs@hostC")
            for i in range(3)]

    wait_for(lambda: completed(jobs), timeout=120, interval=0.5, what="three completed runs")
    wait_for(lambda: len(lifetimes.intervals()) == 3, timeout=10, what="container events")
    lifetimes.close()
    assert_no_overlap(lifetimes.intervals())
    assert host_row(redis_conn, "hostC").concurrency == 1
    hosts = json.loads(fleet_command("status", "--json").stdout)["hosts"]
    assert next(host["concurrency"] for host in hosts if host["name"] == "hostC") == 1
    wait_for(lambda: "3 (0 / 1)" in panel_row(admin_client, "hostC"), timeout=10,
             what="the panel's processes (busy / cap)")


def test_lowering_it_in_the_admin_takes_effect_without_a_restart(start_worker, redis_conn, fast_fleet,
                                                                admin_client):
    assert admin_client.post(SETTINGS_PAGE + "1/change/", {"concurrency": 3}).status_code == 302
    lifetimes = ContainerLifetimes()
    pool(start_worker, redis_conn, "hostL", 3)
    jobs = [enqueue_spec(forge_spec(f"gh-live-{i}", number=30 + i, body="fake-agent:sleep=4"), "pi-jobs@hostL")
            for i in range(6)]
    first = wait_for(lambda: len(started := lifetimes.started()) == 3 and started, timeout=90,
                     what="three containers at once under the cap of 3")

    assert admin_client.post(SETTINGS_PAGE + "1/change/", {"concurrency": 1}).status_code == 302
    wait_for(lambda: host_row(redis_conn, "hostL").concurrency == 1, timeout=10, what="the panel's cap to follow")

    wait_for(lambda: completed(jobs), timeout=180, interval=0.5, what="six completed runs")
    wait_for(lambda: len(lifetimes.intervals()) == 6, timeout=10, what="container events")
    lifetimes.close()
    spans = lifetimes.intervals()
    assert max(start for job, (start, _) in spans.items() if job in first) < \
        min(end for job, (_, end) in spans.items() if job in first)  # the first three ran side by side
    for job in set(spans) - first:  # each later one ran alone
        start, end = spans[job]
        assert all(end <= other_start or other_end <= start
                   for other, (other_start, other_end) in spans.items() if other != job), job
    assert 'name="concurrency"' in admin_client.get(SETTINGS_PAGE + "1/change/").content.decode()


def test_a_crashed_work_horses_slot_is_taken_over_at_once(start_worker, redis_conn, fast_fleet, job_containers):
    worker = start_worker("pi-jobs", "pi-jobs@hostK", env={"PI_WORKER_NAME": "hostK", "PI_CONCURRENCY": "1",
                                                           "PI_SCOPE_BUSY_RECHECK_SECONDS": "1",
                                                           "PI_LOST_RETRIES": "0"})  # its retry would take the slot
    enqueue_spec(forge_spec("gh-crashed", body="fake-agent:sleep=60"), "pi-jobs@hostK")
    wait_for(lambda: job_containers("hostK").get("gh-crashed"), timeout=90, what="the job's container")

    os.kill(horse_of(worker.pid), 9)  # its let_go never runs: the slot stays written in Redis
    wait_for(lambda: Run.objects.filter(job_id="gh-crashed").exists(), timeout=30, what="the worker-lost record")
    enqueue_spec(forge_spec("gh-after-crash", number=8), "pi-jobs@hostK")

    # The lease's TTL is the job's whole time budget (over half an hour): only a take-over lets it run now.
    run = wait_for(lambda: Run.objects.filter(job_id="gh-after-crash").first(), timeout=30, what="the next job")
    assert run.outcome == Outcome.COMPLETED
