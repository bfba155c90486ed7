"""The host registry: real worker processes publish their host's row, readers tell live, stale and gone
apart, and the row carries names, numbers and flags only."""

import json
import time

import pytest

from apps.fleet import registry
from tests.conftest import wait_for
from tests.jobspecs import enqueue_spec, forge_spec

pytestmark = [pytest.mark.django_db(transaction=True)]


def host(redis_conn, name):
    return next((h for h in registry.read_hosts(redis_conn) if h.name == name), None)


@pytest.mark.docker
def test_a_worker_publishes_its_host_row_with_what_it_runs(start_worker, redis_conn, fast_fleet, tmp_path):
    profile = tmp_path / "ci-green.sh"
    profile.write_text("#!/bin/sh\nexit 0\n")
    start_worker("pi-jobs", "pi-jobs@hostA",
                 env={"PI_WORKER_NAME": "hostA", "PI_WAIT_PROFILES": f"ci-green:{profile}",
                      "PI_SECRET_PROFILES": "prod:/etc/pi/prod-secrets"})
    row = wait_for(lambda: host(redis_conn, "hostA"), timeout=60, what="hostA's registry row")

    assert (row.liveness, row.declared, row.routes) == ("live", True, True)
    assert row.capabilities == ("secrets:prod", "wait:ci-green")
    assert row.queues == ("pi-jobs", "pi-jobs@hostA")
    assert len(row.processes) == 1 and row.busy == 0
    assert row.image == "pidispatch-demo:latest" and row.version and row.started_at <= time.time()

    enqueue_spec(forge_spec("gh-seen-running", body="fake-agent:sleep=4"), "pi-jobs@hostA")
    busy = wait_for(lambda: (h := host(redis_conn, "hostA")) and h.busy and h, timeout=90, what="the busy row")
    (job,) = busy.running
    assert (job.job_id, job.target, job.queue) == ("gh-seen-running", "acme/web#7", "pi-jobs@hostA")
    assert time.time() - job.started_at < 60

    stored = json.dumps({key.decode(): {k.decode(): v.decode() for k, v in redis_conn.hgetall(key).items()}
                         for key in redis_conn.keys("pidispatch:*") if redis_conn.type(key) == b"hash"})
    assert str(tmp_path) not in stored and "/etc/pi" not in stored  # profile paths never leave the host
    assert "A bug" not in stored and "fake-agent" not in stored  # nor any issue text


@pytest.mark.docker
def test_an_undeclared_worker_publishes_a_row_that_does_not_route(start_worker, redis_conn, fast_fleet):
    start_worker("pi-jobs")
    row = wait_for(lambda: next(iter(registry.read_hosts(redis_conn)), None), timeout=60, what="a row")

    assert row.declared is False and row.routes is False
    assert row.queues == ("pi-jobs",)


@pytest.mark.docker
def test_a_dead_host_turns_stale_then_gone_and_stays_listed(start_worker, redis_conn, fast_fleet):
    worker = start_worker("pi-jobs", "pi-jobs@hostB", env={"PI_WORKER_NAME": "hostB"})
    wait_for(lambda: host(redis_conn, "hostB"), timeout=60, what="hostB's row")

    worker.kill()

    wait_for(lambda: host(redis_conn, "hostB").liveness == "stale", timeout=30, what="a stale row")
    gone = wait_for(lambda: (h := host(redis_conn, "hostB")).liveness == "gone" and h, timeout=30, what="gone")
    assert gone.routes is False and gone.processes == ()
    assert time.time() - gone.beat_at >= 2  # its last beat is still shown


def test_liveness_follows_the_beat_age(fast_fleet):
    now = 1_000_000.0
    assert registry.liveness_of(now - 1, True, now) == "live"
    assert registry.liveness_of(now - 3, True, now) == "stale"
    assert registry.liveness_of(now - 1, False, now) == "gone"


def test_a_malformed_index_is_reported_unreadable_not_empty(redis_conn):
    redis_conn.set(registry.INDEX, "not a sorted set")

    with pytest.raises(registry.RegistryUnreadable, match="host registry unreadable"):
        registry.read_hosts(redis_conn)


def test_a_worker_process_on_this_machine_is_dead_once_its_pid_is(redis_conn):
    import subprocess

    child = subprocess.Popen(["sleep", "30"])
    entry = registry.WorkerProcess(worker_name="w1", host="hostA", pid=child.pid,
                                   proc=registry.process_identity(child.pid), started_at=None, beat_at=None,
                                   queues=(), job=None)
    assert registry.process_alive(entry)
    child.kill()
    child.wait(30)
    assert not registry.process_alive(entry)
    elsewhere = registry.WorkerProcess(worker_name="w2", host="hostB", pid=child.pid, proc="other-boot/pid:[1]/7/99",
                                       started_at=None, beat_at=None, queues=(), job=None)
    assert registry.process_alive(elsewhere)  # another machine's PID says nothing here: its entry decides


def test_an_invalid_worker_name_refuses_to_start(run_worker):
    result = run_worker("pi-jobs", env_overrides={"PI_WORKER_NAME": "bad name!"}, check=False)

    assert result.returncode != 0
    assert "PI_WORKER_NAME='bad name!' is not a valid worker name" in result.stderr
