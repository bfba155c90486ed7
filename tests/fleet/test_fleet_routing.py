"""Routing: `pi-jobs` vs `pi-jobs@<host>` from the live registry; any doubt routes to `pi-jobs`."""

import time

import pytest

from apps.fleet import hosts, registry, routing


def publish(redis_conn, name, capabilities=(), declared=True, beat_age=0.0):
    facts = registry.HostFacts(name=name, declared=declared, version="1", image="img", capabilities=tuple(capabilities))
    process = registry.ProcessFacts(worker_name=f"w-{name}", pid=1, proc="x/y/1/1", started_at=time.time())
    registry.publish(redis_conn, facts, process, now=time.time() - beat_age)


@pytest.fixture(autouse=True)
def fresh_cache(fast_fleet):
    routing.clear_cache()
    yield
    routing.clear_cache()


def test_no_needs_is_the_shared_queue_without_reading_the_registry(redis_conn):
    redis_conn.set(registry.INDEX, "broken")  # would fail a read

    assert routing.queue_for(frozenset()) == "pi-jobs"


def test_a_need_goes_to_the_live_declared_host_that_offers_it(redis_conn):
    publish(redis_conn, "hostA", ["wait:ci-green"])
    publish(redis_conn, "hostB", ["secrets:prod", "wait:ci-green"])

    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs@hostB"
    assert routing.queue_for(frozenset({"secrets:prod", "wait:ci-green"})) == "pi-jobs@hostB"


def test_several_capable_hosts_are_chosen_deterministically_by_job_id(redis_conn):
    publish(redis_conn, "hostA", ["wait:ci-green"])
    publish(redis_conn, "hostB", ["wait:ci-green"])
    needs = frozenset({"wait:ci-green"})

    assert routing.queue_for(needs) == "pi-jobs@hostA"  # without an id: the first by name
    picks = {job_id: routing.queue_for(needs, job_id) for job_id in (f"gh-{i}" for i in range(20))}
    assert set(picks.values()) == {"pi-jobs@hostA", "pi-jobs@hostB"}  # replicas spread
    assert all(routing.queue_for(needs, job_id) == queue for job_id, queue in picks.items())


@pytest.mark.parametrize("case", ["undeclared", "lacks-it", "no-hosts", "unreadable"])
def test_any_doubt_routes_to_the_shared_queue(redis_conn, case):
    if case == "undeclared":
        publish(redis_conn, "hostA", ["secrets:prod"], declared=False)
    elif case == "lacks-it":
        publish(redis_conn, "hostA", ["wait:ci-green"])
    elif case == "unreadable":
        redis_conn.set(registry.INDEX, "broken")

    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs"


def test_a_need_only_an_absent_host_offers_waits_on_its_queue(redis_conn):
    """Another host would refuse the job (`secret-profile-unknown`): it waits for the host that can run it, whether
    that host's beat is late or its row expired (its card is kept for a day)."""
    publish(redis_conn, "hostA", ["secrets:prod"], beat_age=3)
    publish(redis_conn, "hostB", ["wait:ci-green"])
    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs@hostA"

    redis_conn.delete(registry.host_key("hostA"), registry.host_workers_key("hostA"))  # its row expired
    routing.clear_cache()
    (gone,) = [host for host in registry.read_hosts(redis_conn) if host.name == "hostA"]
    assert gone.liveness == registry.GONE and gone.capabilities == ("secrets:prod",)
    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs@hostA"

    publish(redis_conn, "hostC", ["secrets:prod"])  # a live host that offers it wins
    routing.clear_cache()
    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs@hostC"


def test_registry_reads_are_cached_between_deliveries(redis_conn, settings):
    settings.PI_FLEET_ROUTE_CACHE_SECONDS = 60
    publish(redis_conn, "hostA", ["secrets:prod"])
    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs@hostA"

    redis_conn.flushdb()

    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs@hostA"
    routing.clear_cache()
    assert routing.queue_for(frozenset({"secrets:prod"})) == "pi-jobs"


def test_host_affine_work_goes_to_this_hosts_queue_when_declared(settings, monkeypatch):
    monkeypatch.setattr(hosts, "_declared_by_queue", None)
    settings.PI_WORKER_NAME = ""
    assert routing.host_affine_queue() == "pi-jobs"

    settings.PI_WORKER_NAME = "hostA"
    assert routing.host_affine_queue() == "pi-jobs@hostA"
