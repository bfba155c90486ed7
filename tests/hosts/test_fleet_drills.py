"""The fleet as a fleet: three worker hosts, each in its own network namespace with its own address and Docker
engine (tests/hosts_support.py), the services in the root namespace, and drills that load them, kill one, cut
one off and restart Redis under them. Every assertion is on run records and on the containers each host's own
engine saw, never on log lines."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run, ScopedLimit
from tests.conftest import wait_for
from tests.process_support import ContainerLifetimes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def drill(fleet, settings):
    """The fleet for one drill: this test's Redis and triggers; afterwards every worker stopped, every link up,
    every container gone, Redis empty."""
    settings.REDIS_URL = fleet._loopback_redis()
    from apps.fleet.connection import get_redis

    get_redis().flushall()
    yield fleet
    for host in fleet.hosts.values():
        host.restore()
        host.stop_workers()
        for container in host.containers().values():
            container.remove(force=True)
    get_redis().flushall()


def declare_vaults(fleet) -> dict[str, dict]:
    """Each host offers a secret profile of its own (`vault-<host>`): a job needing it can run only there."""
    environments = {}
    for host in fleet.hosts.values():
        resolver = host.folder / "resolver.sh"
        resolver.write_text("#!/bin/sh\necho drill-value\n")
        resolver.chmod(0o755)
        environments[host.name] = {"PI_SECRET_PROFILES": f"vault-{host.name}:{resolver}"}
    return environments


def label_triggers(hosts) -> None:
    """`pi` runs anywhere (the shared queue); `pi-<host>` needs that host's vault (its host queue)."""
    Trigger.objects.create(position=0, kind="github", on_type="label", label_any=["pi"], flow="fix-bug")
    for position, host in enumerate(hosts, start=1):
        Trigger.objects.create(position=position, kind="github", on_type="label", label_any=[f"pi-{host}"],
                               flow="fix-bug", secrets={"DRILL_TOKEN": "drill/ref"},
                               secrets_profile=f"vault-{host}")


def overlaps(intervals: list[tuple[int, int]]) -> bool:
    ordered = sorted(intervals)
    return any(second_start < first_end for (_, first_end), (second_start, _) in pairwise(ordered))


def wait_live(*names):
    """Until the registry calls each of these hosts live (its workers beat), as routing will read it."""
    from apps.fleet import registry
    from apps.fleet.connection import get_redis

    def live():
        rows = {host.name: host for host in registry.read_hosts(get_redis())}
        return all(name in rows and rows[name].liveness == registry.LIVE for name in names)

    wait_for(live, timeout=60, what=f"{', '.join(names)} live in the registry")


def final_runs(job_ids) -> dict[str, list[tuple[str, str]]]:
    """Each job's records that end it (completed or refused), as (outcome, reason)."""
    found = {}
    for job_id, outcome, reason in Run.objects.filter(job_id__in=job_ids).exclude(
            outcome=Outcome.FAILED).values_list("job_id", "outcome", "reason"):
        found.setdefault(job_id, []).append((outcome, reason))
    return found


def completed_runs(job_ids) -> Counter:
    return Counter(Run.objects.filter(job_id__in=job_ids, outcome=Outcome.COMPLETED).values_list("job_id", flat=True))


def test_load_across_the_fleet_keeps_every_bound(drill):
    """30 signed deliveries over the shared queue and all three host queues, a repository limited to one
    container at a time fleet-wide, a host limited to one: every delivery runs once, and no engine of any host
    ever shows two containers of that repository, nor the capped host two containers, at once."""
    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    ScopedLimit.objects.create(scope="acme/capped", concurrent=1)
    watches = {name: ContainerLifetimes(host.engine()) for name, host in drill.hosts.items()}
    for name, host in drill.hosts.items():
        extra = {**vaults[name], **({"PI_CONCURRENCY": 1} if name == "hostC" else {})}
        for _ in range(2):
            host.start_worker(drill.host_env(host, **extra))

    wait_live(*drill.hosts)
    labels = ["pi", "pi-hostA", "pi-hostB", "pi-hostC"]
    jobs = {}
    for number in range(1, 31):
        repository = "acme/capped" if number % 3 == 0 else f"acme/web{number % 4}"
        answer = drill.deliver(repository, number, labels=(labels[number % 4],), body="fake-agent:sleep=2")
        (job_id,) = answer["jobs"]
        jobs[job_id] = (repository, labels[number % 4])

    wait_for(lambda: len(final_runs(jobs)) == len(jobs), timeout=240, what="every delivery's run")
    for watch in watches.values():
        watch.close()

    assert {job_id: runs for job_id, runs in final_runs(jobs).items() if runs != [("completed", "")]} == {}
    hosts_of = dict(Run.objects.filter(job_id__in=jobs, outcome=Outcome.COMPLETED).values_list("job_id", "host"))
    for job_id, (_, label) in jobs.items():
        if label != "pi":
            assert hosts_of[job_id] == label.removeprefix("pi-"), "a host-queue job ran on another host"
    assert len(set(hosts_of.values())) == 3  # the shared queue's jobs spread too

    capped, by_host = [], {}
    for name, watch in watches.items():
        intervals = watch.intervals()
        by_host[name] = list(intervals.values())
        capped += [span for job_id, span in intervals.items() if jobs.get(job_id, ("",))[0] == "acme/capped"]
    assert len(capped) == 10 and not overlaps(capped), "two containers of the capped repository at once"
    assert not overlaps(by_host["hostC"]), "two containers at once on the host capped at one"
    assert any(overlaps(spans) for spans in by_host.values())  # elsewhere the fleet did run jobs side by side
