"""The fleet of tests/hosts/test_fleet_drills.py (three hosts in network namespaces, their own Docker engines,
PostgreSQL) with its Redis behind Sentinel: a primary, a replica and three `redis-server --sentinel` on the
services' address. The primary is SIGKILLed while deliveries and manual runs arrive: every accepted job ends with
exactly one completed run, no worker process died, no container is left.

Its time, measured on the two-core machine it was written on: alone 65 s (the fleet's start 12 s, the drill 38 s,
the fleet's stop 15 s); in the PostgreSQL part of `.ci/run`, beside the rest of it, the drill 41 s and the stop 10 s,
its start 311 s of which all but about 12 s waits for the other drills' fleet (one fleet per machine). The part took
632 s with it, 594-604 s without."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connections

from apps.fleet.connection import rq_queue_config, sentinel_addresses
from apps.fleet.queues import QueueConfigMap
from apps.worker.models import AcceptedJob, Outcome, Run
from tests.conftest import joined, wait_for
from tests.hosts.test_fleet_drills import declare_vaults, deliver_to, label_triggers, start_hosts
from tests.receiver_support import STAND_IN_TOKEN
from tests.sentinel_support import MASTER_NAME

# One fleet runs on a machine at a time (a lock): under xdist this module's fleet may wait for the other drills'
# module to end (about 8 minutes) before its own start, and that wait counts against the first test's ceiling.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(1200)]


@pytest.fixture
def drill(sentinel_fleet, settings):
    """This test process finds the primary through the fleet's sentinels too (its manual runs are an operator's);
    afterwards every worker stopped, every container gone, Redis empty."""
    group = sentinel_fleet.sentinel_group
    settings.REDIS_URL = "redis://nowhere.invalid:1/0"
    settings.REDIS_SENTINELS = sentinel_addresses(group.sentinels_setting)
    settings.REDIS_SENTINEL_MASTER = MASTER_NAME
    settings.RQ_QUEUES = QueueConfigMap(rq_queue_config(settings.REDIS_URL, settings.REDIS_SENTINELS, MASTER_NAME,
                                                        "", settings.PI_REDIS_FAILOVER_WAIT_SECONDS))
    settings.GITHUB_API_URL, settings.GITHUB_TOKEN = sentinel_fleet.forge.url, STAND_IN_TOKEN
    from apps.fleet.connection import get_redis

    get_redis().flushall()
    yield sentinel_fleet
    for host in sentinel_fleet.hosts.values():
        host.stop_workers()
        for container in host.containers().values():
            container.remove(force=True)


def test_a_primary_killed_under_load_loses_no_accepted_job(drill):
    from apps.receiver.models import Delivery
    from apps.worker.manual_runs import start_forge_run

    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    start_hosts(drill, vaults, workers_per_host=2)
    group = drill.sentinel_group
    started_at = drill.now()
    manual, stop, errors = [], threading.Event(), []

    def keep_delivering(labels, first):
        number = first
        while not stop.is_set():
            number += 1
            try:
                deliver_to(drill, labels[number % len(labels)], number, "fake-agent:sleep=3")
            except Exception as error:  # a delivery that got no 2xx: the forge would have to send it again
                errors.append(f"delivery {number}: {error!r}")
            time.sleep(0.4)

    def keep_starting_runs():
        number = 500
        try:
            while not stop.is_set():
                number += 1
                try:  # this process's own client: it waits for the new primary as the admin and the API would
                    manual.append(start_forge_run("github", "acme/web", number, task="fake-agent:sleep=2").job_id)
                except Exception as error:
                    errors.append(f"manual run {number}: {error!r}")
                time.sleep(0.7)
        finally:
            connections.close_all()  # this thread's own database connection (the test database is dropped after)

    load = [threading.Thread(target=keep_delivering, args=(["pi", "pi-hostA", "pi-hostB", "pi-hostC"], 100)),
            threading.Thread(target=keep_starting_runs)]
    for thread in load:
        thread.start()
    try:
        wait_for(lambda: all(host.containers() for host in drill.hosts.values()), timeout=90,
                 what="containers on every host")
        old = group.kill_primary()
        new = group.wait_for_new_primary(old)
        time.sleep(10)  # the load goes on against the new primary
    finally:
        stop.set()
        for thread in load:
            joined(thread, 90, "the load's last request")
    assert errors == []
    assert group.primary_port() == new

    wait_for(lambda: all(d.job_ids for d in Delivery.objects.filter(received_at__gte=started_at)), timeout=120,
             what="every delivery queued")
    accepted = set(AcceptedJob.objects.filter(accepted_at__gte=started_at).values_list("job_id", flat=True))
    assert set(manual) <= accepted and len(accepted) > len(manual) > 5

    def ended() -> bool:
        return set(Run.objects.filter(job_id__in=accepted).exclude(outcome=Outcome.FAILED)
                   .values_list("job_id", flat=True)) == accepted

    wait_for(ended, timeout=240, what="every accepted job's run")
    time.sleep(3)  # a job run twice would show its second record now
    records = Counter(Run.objects.filter(job_id__in=accepted).values_list("job_id", "outcome"))
    assert records == {(job_id, Outcome.COMPLETED): 1 for job_id in accepted}
    assert all(worker.starts == 1 and worker.process.poll() is None
               for host in drill.hosts.values() for worker in host.workers)
    wait_for(lambda: not any(host.containers() for host in drill.hosts.values()), timeout=60,
             what="no container left on any host")
