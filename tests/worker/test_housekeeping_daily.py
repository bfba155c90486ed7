"""The workers' daily housekeeping: real `manage.py rqworker` processes run it once for the UTC day across the
fleet, however many of them find it due at once; a run started again the same day does nothing; a failed one says
so and is tried again later; a burst worker, or PI_HOUSEKEEPING_DAILY=false, leaves it alone."""

import json
import subprocess
import sys
import time

import pytest
from django.utils import timezone

from apps.fleet import registry
from apps.worker import housekeeping
from apps.worker.models import Run
from tests.conftest import ROOT, wait_for
from tests.cost_support import make_run

pytestmark = [pytest.mark.django_db(transaction=True)]

DAILY = {"PI_HOUSEKEEPING_DAILY": "true"}


def old_runs(count: int = 3):
    for index in range(count):
        make_run(f"gh-old-{index}", 400 + index)
    make_run("gh-new", 1)


def daily_run(worker_env, **env) -> subprocess.Popen:
    """`manage.py housekeeping --daily`, as a worker starts it beside itself."""
    return subprocess.Popen([sys.executable, "manage.py", "housekeeping", "--daily"], cwd=ROOT,
                            env={**worker_env, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.docker
def test_two_worker_processes_run_it_once_for_the_day(start_worker, redis_conn, worker_env):
    old_runs()
    workers = [start_worker("pi-jobs", env={**DAILY, "PI_WORKER_NAME": name}, name=name) for name in ("hostA", "hostB")]

    record = wait_for(lambda: housekeeping.last_run(redis_conn), timeout=90, what="the day's housekeeping")
    assert list(Run.objects.values_list("job_id", flat=True)) == ["gh-new"]
    assert record["how"] == "daily" and record["deleted"]["runs"] == 3
    assert record["by"].split("#")[0] in ("hostA", "hostB")
    assert housekeeping.todays(redis_conn)["state"] == "done"
    time.sleep(3)  # both have looked at their first beat; a run either of them started has ended
    logs = "".join(worker.output() for worker in workers)
    assert logs.count("housekeeping_started how=daily") == 1, logs
    assert logs.count("housekeeping_done how=daily") == 1, logs

    # A worker that looks again the same day (or starts then) finds the day's run done.
    again = daily_run(worker_env)
    output, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and "housekeeping_started" not in output, output
    assert housekeeping.last_run(redis_conn) == record


def test_however_many_start_at_once_one_does_the_day(redis_conn, worker_env):
    old_runs(30)
    racers = [daily_run(worker_env) for _ in range(4)]
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0, 0, 0], outputs
    assert sum(output.count("housekeeping_started") for output in outputs) == 1, outputs
    assert Run.objects.count() == 1
    assert housekeeping.last_run(redis_conn)["deleted"]["runs"] == 30


def test_a_failed_daily_run_says_so_and_is_tried_again_after_its_backoff(redis_conn, worker_env):
    old_runs(1)
    broken = daily_run(worker_env, DATABASE_URL="postgres://nobody@127.0.0.1:1/none")
    output, _ = broken.communicate(timeout=60)
    assert broken.returncode == 1, output
    assert "housekeeping_failed how=daily error=OperationalError" in output
    assert "housekeeping stopped: OperationalError" in output
    today = housekeeping.todays(redis_conn)
    assert today["state"] == "failed" and today["error"] == "OperationalError"
    assert not housekeeping.due_today(redis_conn)  # no worker tries again at once
    assert 0 < redis_conn.ttl(housekeeping.day_key(timezone.now())) <= housekeeping.RETRY_SECONDS

    redis_conn.delete(housekeeping.day_key(timezone.now()))  # the backoff is over
    retried = daily_run(worker_env)
    output, _ = retried.communicate(timeout=60)
    assert retried.returncode == 0 and "housekeeping_done how=daily" in output, output
    assert Run.objects.count() == 1


@pytest.mark.docker
def test_a_burst_worker_and_a_switched_off_fleet_leave_it_alone(run_worker, start_worker, redis_conn):
    old_runs(1)
    run_worker("pi-jobs", env_overrides=DAILY)  # drains the queues and exits: no duty of its own
    worker = start_worker("pi-jobs", env={"PI_HOUSEKEEPING_DAILY": "false", "PI_WORKER_NAME": "hostC"})
    wait_for(lambda: any(host.name == "hostC" for host in registry.read_hosts(redis_conn)), timeout=60,
             what="the worker's first beat")
    time.sleep(3)  # it has looked at its first beat
    assert housekeeping.last_run(redis_conn) is None and housekeeping.running(redis_conn) is None
    assert Run.objects.count() == 2
    assert "housekeeping" not in worker.output()
    assert json.dumps(redis_conn.keys("pidispatch:housekeeping:*")) == "[]"
