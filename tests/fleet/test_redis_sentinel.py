"""Behind Redis Sentinel (a real primary, a replica and three `redis-server --sentinel`, tests/sentinel_support.py):
every client of the product finds the primary through the sentinels, a command that meets the switch waits for the
new primary instead of failing, a worker running a job through a failover finishes it and records it once, and
`doctor` names the primary and the replicas and warns when none is in sync. The drill under load, on PostgreSQL and
three hosts, is tests/hosts/test_sentinel_drill.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.core.cache import caches

from apps.fleet.connection import rq_queue_config, sentinel_addresses
from apps.fleet.queues import QueueConfigMap
from apps.worker.models import Outcome, Run
from tests.conftest import ROOT, wait_for
from tests.jobspecs import enqueue_spec, forge_spec
from tests.sentinel_support import MASTER_NAME, SentinelGroup

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


@pytest.fixture
def sentinels(request, tmp_path, settings):
    """The group, and this process's settings pointed at it as the environment would point them. Marked
    `down_after_ms(N)`: sentinels that call a primary down only after N ms (a failover of production's pace)."""
    marker = request.node.get_closest_marker("down_after_ms")
    group = SentinelGroup(tmp_path / "sentinel", **({"down_after_ms": marker.args[0]} if marker else {})).start()
    settings.REDIS_URL = "redis://nowhere.invalid:1/0"  # behind Sentinel only its database number counts
    settings.REDIS_SENTINELS = sentinel_addresses(group.sentinels_setting)
    settings.REDIS_SENTINEL_MASTER = MASTER_NAME
    settings.PI_REDIS_FAILOVER_WAIT_SECONDS = 30
    settings.RQ_QUEUES = QueueConfigMap(rq_queue_config(settings.REDIS_URL, settings.REDIS_SENTINELS, MASTER_NAME,
                                                        "", 30))
    yield group
    group.stop()


@pytest.mark.down_after_ms(8000)  # longer than redis-py's own retries (about 5 s)
def test_every_client_finds_the_primary_and_a_command_during_a_failover_waits_for_the_new_one(sentinels):
    import django_rq

    from apps.fleet.connection import get_redis
    from apps.worker.doctor import check_redis

    primary = sentinels.primary_port()
    get_redis().set("probe:app", "1")
    django_rq.get_connection("pi-jobs@hostA").set("probe:rq", "1")  # what `rqworker` and the queues use
    # The API's per-token counts, through a cache built as a process builds it (this process's own "api" cache
    # may hold an earlier test's pool).
    caches.create_connection("api").set("probe", 1)
    on_primary = sentinels.client(primary)
    assert on_primary.get("probe:app") == b"1" and on_primary.get("probe:rq") == b"1"
    assert any(b"pidispatch:api" in key for key in on_primary.keys("*probe*"))
    wait_for(lambda: sentinels.client(sentinels.ports[1] if primary == sentinels.ports[0] else sentinels.ports[0])
             .get("probe:app") == b"1", timeout=10, what="the replica to hold the probe")

    sentinels.kill_primary()
    started = time.monotonic()
    get_redis().set("probe:after", "2")  # no primary for a while: it waits, it does not fail
    waited = time.monotonic() - started
    new = sentinels.primary_port()
    assert new != primary and sentinels.client(new).get("probe:after") == b"2"
    assert sentinels.client(new).get("probe:app") == b"1"
    assert 8 < waited < 30, waited
    assert django_rq.get_connection("pi-jobs").get("probe:after") == b"2"

    findings = check_redis(get_redis())
    assert findings[0].status == "ok" and f"primary 127.0.0.1:{new}" in findings[0].finding
    # The old primary is gone and nothing replicates the new one: a failover now would lose what it holds.
    assert any(f.check == "redis-replicas" and "no replica is in sync" in f.finding for f in findings)


def test_a_command_waits_only_so_long_for_a_primary(sentinels, settings):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from apps.fleet.connection import get_redis

    settings.PI_REDIS_FAILOVER_WAIT_SECONDS = 3
    get_redis().ping()
    for port in sentinels.ports:  # the primary and the replica: nothing to promote
        sentinels.redis_services[port].stop()
    started = time.monotonic()
    with pytest.raises(RedisConnectionError):
        get_redis().set("probe", "1")
    assert time.monotonic() - started < 10


def test_doctor_names_the_primary_and_its_replica_in_sync(sentinels):
    from apps.fleet.connection import get_redis
    from apps.worker.doctor import check_redis

    primary, replica = sentinels.primary_port(), [p for p in sentinels.ports if p != sentinels.primary_port()][0]
    wait_for(lambda: check_redis(get_redis())[0].finding.endswith("3 of 3 sentinels answer"), timeout=10,
             what="doctor to see the sentinels")
    findings = check_redis(get_redis())
    assert f"primary 127.0.0.1:{primary}; replicas: 127.0.0.1:{replica} (in sync)" in findings[0].finding
    assert not [f for f in findings if f.check == "redis-replicas"]
    sentinels.sentinels[2].stop()
    assert any(f.check == "redis-replicas" and "1 of 3 sentinels do not answer" in f.finding
               for f in check_redis(get_redis()))


def test_the_fleet_panel_names_the_primary_and_warns_when_no_replica_is_in_sync(sentinels, admin_client):
    primary, replica = sentinels.primary_port(), [p for p in sentinels.ports if p != sentinels.primary_port()][0]
    body = admin_client.get("/admin/fleet/fleetpanel/body/").content.decode()
    assert f"Redis: primary 127.0.0.1:{primary}; replicas: 127.0.0.1:{replica} (in sync)" in body
    assert 'id="fleet-redis-warning"' not in body
    sentinels.redis_services[replica].stop()
    body = admin_client.get("/admin/fleet/fleetpanel/body/").content.decode()
    assert 'id="fleet-redis-warning">Redis: no replica is in sync' in body


@pytest.mark.parametrize(("environment", "says"), [
    ({"REDIS_SENTINELS": "10.0.0.5"}, "REDIS_SENTINELS: '10.0.0.5' is not host:port"),
    ({"REDIS_SENTINELS": "10.0.0.5:26379"}, "REDIS_SENTINEL_MASTER is not"),
])
def test_a_sentinel_setting_that_cannot_work_stops_every_process_saying_why(environment, says):
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, **environment}, timeout=60)
    assert result.returncode != 0 and says in result.stderr, result.stderr[-2000:]


@pytest.mark.docker
def test_a_worker_follows_a_failover_and_its_running_job_is_recorded_once(sentinels, start_worker, job_containers,
                                                                          fast_fleet):
    worker = start_worker("pi-jobs", env={**sentinels.env(), "PI_WORKER_NAME": "hostA"})
    enqueue_spec(forge_spec("gh-sentinel-1", body="fake-agent:sleep=6"), "pi-jobs")
    wait_for(lambda: "gh-sentinel-1" in job_containers("hostA"), timeout=90, what="the job's container")

    old = sentinels.kill_primary()
    sentinels.wait_for_new_primary(old)
    wait_for(lambda: Run.objects.filter(job_id="gh-sentinel-1").exists(), timeout=90, what="the job's record")
    enqueue_spec(forge_spec("gh-sentinel-2", body="fake-agent:sleep=1", number=8), "pi-jobs")  # on the new primary
    wait_for(lambda: Run.objects.filter(job_id="gh-sentinel-2").exists(), timeout=90, what="the next job's record")

    time.sleep(2)  # a second record of the first job would come from a rerun now
    assert list(Run.objects.filter(job_id__in=["gh-sentinel-1", "gh-sentinel-2"]).order_by("job_id")
                .values_list("job_id", "outcome")) == [("gh-sentinel-1", Outcome.COMPLETED),
                                                        ("gh-sentinel-2", Outcome.COMPLETED)]
    assert worker.alive(), worker.output()
    wait_for(lambda: not job_containers("hostA"), timeout=30, what="no container left")


def test_an_enqueue_waits_until_a_replica_holds_it_and_says_so_when_none_does_in_time(sentinels, settings, caplog):
    """PI_REDIS_MIN_REPLICAS=1: the enqueue (what a webhook's 2xx waits for) returns only once the replica has the
    job. The replica is stopped (SIGSTOP) for a second: the enqueue takes that second. Stopped past the wait: the job
    is queued all the same, its accepted row in the database, and a warning and the metric's counter say so."""
    from apps.fleet.connection import get_redis
    from apps.worker.jobs import UNREPLICATED_KEY
    from apps.worker.models import AcceptedJob

    settings.PI_REDIS_MIN_REPLICAS = 1
    settings.PI_REDIS_REPLICA_WAIT_MS = 5000
    primary = sentinels.primary_port()
    replica = next(port for port in sentinels.ports if port != primary)
    stopped = sentinels.redis_services[replica].process

    os.kill(stopped.pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (stopped.pid, signal.SIGCONT)).start()
    started = time.monotonic()
    enqueue_spec(forge_spec("gh-replicated"))
    assert time.monotonic() - started > 0.9
    assert sentinels.client(replica).exists("rq:job:gh-replicated")

    settings.PI_REDIS_REPLICA_WAIT_MS = 300
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        with caplog.at_level("WARNING", logger="pidispatch.jobs"):
            enqueue_spec(forge_spec("gh-unreplicated", number=8))
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    assert "redis_unreplicated job=gh-unreplicated replicas=0 wanted=1" in caplog.text
    assert get_redis().exists("rq:job:gh-unreplicated") and AcceptedJob.objects.filter(job_id="gh-unreplicated")
    assert int(get_redis().get(UNREPLICATED_KEY)) == 1
