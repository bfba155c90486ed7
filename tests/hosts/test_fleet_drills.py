"""The fleet as a fleet: three worker hosts, each in its own network namespace with its own address and Docker
engine (tests/hosts_support.py), the services in the root namespace, and drills that load them, kill one, cut
one off and restart Redis under them. Every assertion is on run records and on the containers each host's own
engine saw, never on log lines."""

from __future__ import annotations

import threading
import time
from collections import Counter
from itertools import pairwise

import pytest

from apps.receiver.models import Trigger
from apps.worker.models import Outcome, Run, ScopedLimit
from tests.conftest import joined, wait_for
from tests.process_support import ContainerLifetimes

# The cut-off drill keeps a host's link down 120 s by design and took 172 s in all beside the rest of the PostgreSQL
# part; the first drill also starts the fleet (three engines): 600 s each.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


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


@pytest.fixture
def redis_conn_of_fleet(drill):
    from apps.fleet.connection import get_redis

    return get_redis()


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


def start_hosts(drill, vaults, workers_per_host=1, **extra_by_host):
    for name, host in drill.hosts.items():
        for _ in range(workers_per_host):
            host.start_worker(drill.host_env(host, **vaults[name], **extra_by_host.get(name, {})))
    wait_live(*drill.hosts)


def deliver_to(drill, label: str, number: int, body: str, repository="acme/web") -> str:
    (job_id,) = drill.deliver(repository, number, labels=(label,), body=body)["jobs"]
    return job_id


def queued_in(queue: str) -> list[str]:
    from rq import Queue

    from apps.fleet.connection import get_redis

    return Queue(queue, connection=get_redis()).job_ids


def test_pause_all_reaches_a_dead_hosts_queue_and_it_stays_paused_when_it_returns(drill):
    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    start_hosts(drill, vaults)
    hostB = drill.hosts["hostB"]
    hostB.kill_workers()

    paused = drill.fleet_command("pause", "--all", "--note", "provider outage", "--by", "drill")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    time.sleep(2)  # a worker honours a pause flag within about a second
    waiting = deliver_to(drill, "pi-hostB", 1, "fake-agent:sleep=1")
    assert queued_in("pi-jobs@hostB") == [waiting]  # routed to its host, which is away

    hostB.revive_workers()
    wait_live("hostB")
    time.sleep(5)  # the host is back and beating: its queue stays paused, the job waits
    assert not Run.objects.filter(job_id=waiting).exists() and queued_in("pi-jobs@hostB") == [waiting]

    resumed = drill.fleet_command("resume", "--all", "--by", "drill")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    wait_for(lambda: final_runs([waiting]), timeout=60, what="the job once resumed")
    assert final_runs([waiting]) == {waiting: [("completed", "")]}
    assert Run.objects.get(job_id=waiting).host == "hostB"


def test_a_capability_only_a_dead_host_offers_waits_for_that_host(drill):
    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    start_hosts(drill, vaults)
    hostC = drill.hosts["hostC"]
    hostC.kill_workers()
    time.sleep(4)  # its beat is late: the registry calls it stale, not live

    job_id = deliver_to(drill, "pi-hostC", 2, "fake-agent:sleep=1")
    shared = deliver_to(drill, "pi", 3, "fake-agent:sleep=1")
    wait_for(lambda: final_runs([shared]), timeout=60, what="the shared queue's job")
    assert queued_in("pi-jobs@hostC") == [job_id]  # no live host took it, none refused it
    assert not Run.objects.filter(job_id=job_id).exists()

    hostC.revive_workers()
    wait_for(lambda: final_runs([job_id]), timeout=60, what="the job on its host's return")
    assert final_runs([job_id]) == {job_id: [("completed", "")]}
    assert Run.objects.get(job_id=job_id).host == "hostC"


def test_a_host_cut_off_rejoins_on_its_own_and_every_job_is_recorded_once(drill):
    """hostA's link goes down for 30 s and hostB's for 120 s while their jobs run; hostB rides out the Redis it
    cannot reach for longer than that (PI_REDIS_OUTAGE_SECONDS). A cancel sent to hostB's other job while it is
    away is carried out when it returns; pause and resume reach both hosts afterwards."""
    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    hostA, hostB = drill.hosts["hostA"], drill.hosts["hostB"]
    start_hosts(drill, vaults, workers_per_host=2, hostB={"PI_REDIS_OUTAGE_SECONDS": 180})
    short_a = deliver_to(drill, "pi-hostA", 11, "fake-agent:sleep=20")
    short_b = deliver_to(drill, "pi-hostB", 12, "fake-agent:sleep=40")
    long_b = deliver_to(drill, "pi-hostB", 13, "fake-agent:sleep=600")
    wait_for(lambda: short_a in hostA.containers() and {short_b, long_b} <= set(hostB.containers()), timeout=60,
             what="the three containers")

    hostA.cut()
    hostB.cut()
    cut_at = time.monotonic()
    cancelled = drill.fleet_command("cancel", long_b, "--by", "drill")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    time.sleep(max(0.0, cut_at + 30 - time.monotonic()))
    hostA.restore()
    wait_for(lambda: final_runs([short_a]), timeout=90, what="hostA's job recorded after its return")
    time.sleep(max(0.0, cut_at + 120 - time.monotonic()))  # hostB's link down 120 s in all
    hostB.restore()
    wait_for(lambda: len(final_runs([short_b, long_b])) == 2, timeout=120, what="hostB's jobs recorded on its return")

    every = Counter(Run.objects.filter(job_id__in=[short_a, short_b, long_b]).values_list("job_id", flat=True))
    assert every == {short_a: 1, short_b: 1, long_b: 1}  # recorded exactly once each
    assert final_runs([short_a, short_b, long_b]) == {
        short_a: [("completed", "")], short_b: [("completed", "")], long_b: [("policy", "operator-cancel")]}
    assert hostB.containers() == {}

    wait_live("hostA", "hostB")  # they rejoined by themselves
    paused = drill.fleet_command("pause", "--host", "hostB", "--note", "drill", "--by", "drill")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    time.sleep(2)  # a worker honours a pause flag within about a second
    after = deliver_to(drill, "pi-hostB", 14, "fake-agent:sleep=1")
    time.sleep(4)
    assert not Run.objects.filter(job_id=after).exists()
    drill.fleet_command("resume", "--host", "hostB", "--by", "drill")
    wait_for(lambda: final_runs([after]), timeout=60, what="the job after the resume")
    assert final_runs([after]) == {after: [("completed", "")]}


def test_redis_restarted_under_running_jobs_loses_nothing(drill):
    """Redis goes away for 10 s while every host runs jobs, and deliveries keep arriving: every job runs once
    and no worker process died (the service manager never had to start one again)."""
    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    start_hosts(drill, vaults, workers_per_host=2)
    jobs = [deliver_to(drill, label, number, "fake-agent:sleep=15")
            for number, label in enumerate(["pi-hostA", "pi-hostB", "pi-hostC"] * 2, start=21)]
    wait_for(lambda: all(host.containers() for host in drill.hosts.values()), timeout=60,
             what="containers on every host")

    outage = threading.Thread(target=drill.restart_redis, args=(10,))
    outage.start()
    time.sleep(2)
    during = [drill.deliver("acme/web", number, labels=("pi",), body="fake-agent:sleep=1") for number in (31, 32)]
    joined(outage, 120, "Redis to be restarted")

    assert len(during) == 2  # answered (kept in the inbox when they could not be queued)

    from apps.receiver.models import Delivery

    wait_for(lambda: Delivery.objects.count() == 8 and all(d.job_ids for d in Delivery.objects.all()), timeout=120,
             what="every delivery queued, the two of the outage by the replayer")
    every = [job for delivery in Delivery.objects.all() for job in delivery.job_ids]
    wait_for(lambda: len(final_runs(every)) == 8, timeout=180, what="every job's run after the outage")
    assert set(map(tuple, final_runs(every).values())) == {(("completed", ""),)}
    assert set(jobs) < set(every)
    assert all(worker.starts == 1 and worker.process.poll() is None
               for host in drill.hosts.values() for worker in host.workers)


def test_redis_restarted_empty_under_running_jobs_forgets_no_job_and_no_pause(drill):
    """Redis comes back empty while hostB and hostC run a job each, hostB's queue holds one waiting behind it and
    hostA's paused queue one behind its pause: the running jobs are not run again, the waiting one is queued again
    from the database and runs once, the pause holds until it is resumed, and no worker process died."""
    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    start_hosts(drill, vaults)
    paused = drill.fleet_command("pause", "--queue", "pi-jobs@hostA", "--note", "drill", "--by", "drill")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    running = [deliver_to(drill, label, number, "fake-agent:sleep=15")
               for number, label in ((51, "pi-hostB"), (52, "pi-hostC"))]
    hostB, hostC = drill.hosts["hostB"], drill.hosts["hostC"]
    wait_for(lambda: running[0] in hostB.containers() and running[1] in hostC.containers(), timeout=60,
             what="the two running jobs' containers")
    waiting = deliver_to(drill, "pi-hostB", 53, "fake-agent:sleep=1")
    held = deliver_to(drill, "pi-hostA", 54, "fake-agent:sleep=1")

    drill.restart_redis(2, empty=True)

    wait_for(lambda: len(final_runs([*running, waiting])) == 3, timeout=180, what="every accepted job's run")
    time.sleep(3)  # the paused queue's job has had its chance to run, had its pause been forgotten
    assert not Run.objects.filter(job_id=held).exists()
    assert queued_in("pi-jobs@hostA") == [held]
    resumed = drill.fleet_command("resume", "--queue", "pi-jobs@hostA", "--by", "drill")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    wait_for(lambda: final_runs([held]), timeout=60, what="the held job once resumed")
    every = [*running, waiting, held]
    assert Counter(Run.objects.filter(job_id__in=every).values_list("job_id", flat=True)) == dict.fromkeys(every, 1)
    assert set(map(tuple, final_runs(every).values())) == {(("completed", ""),)}
    assert all(worker.starts == 1 and worker.process.poll() is None
               for host in drill.hosts.values() for worker in host.workers)


def test_a_host_killed_mid_job_loses_its_jobs_once_and_they_run_again(drill, redis_conn_of_fleet):
    """hostB's worker processes are SIGKILLed with their containers left running: each of its jobs is recorded
    `worker-lost` once and run again as a second attempt, the shared queue's by a live host, its own queue's by
    hostB once it returns, whose boot reaper removes the orphaned containers. Each attempt's dollar hold is
    charged once: the lost one whole, none left held."""
    from apps.worker.gates import budget

    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    hostB = drill.hosts["hostB"]
    dollars = {"PI_MAX_COST_USD": "1", "PI_DAILY_COST_USD": "10"}
    for _ in range(2):
        hostB.start_worker(drill.host_env(hostB, **vaults["hostB"], **dollars))
    wait_live("hostB")
    shared = deliver_to(drill, "pi", 41, "fake-agent:sleep=20")
    own = deliver_to(drill, "pi-hostB", 42, "fake-agent:sleep=20")
    running = lambda: {job for job, c in hostB.containers().items() if c.status == "running"}  # noqa: E731
    wait_for(lambda: {shared, own} <= running(), timeout=60, what="both jobs' containers running on hostB")
    for name in ("hostA", "hostC"):
        host = drill.hosts[name]
        host.start_worker(drill.host_env(host, **vaults[name], **dollars))

    hostB.kill_workers()
    assert {shared, own} <= running()  # the containers live on without their workers

    wait_for(lambda: final_runs([shared]), timeout=120, what="the shared job run again on a live host")
    rerun = Run.objects.get(job_id=shared, attempt=2)
    assert (rerun.outcome, rerun.host in ("hostA", "hostC")) == (Outcome.COMPLETED, True)
    wait_for(lambda: Run.objects.filter(job_id=own, reason="worker-lost").exists(), timeout=60,
             what="the host-queue job recorded lost")
    time.sleep(5)
    assert not final_runs([own])  # it waits for its host

    hostB.revive_workers()
    wait_for(lambda: final_runs([own]), timeout=120, what="the host-queue job on its host's return")
    for job_id in (shared, own):
        runs = list(Run.objects.filter(job_id=job_id).order_by("attempt").values_list("attempt", "outcome", "reason"))
        assert runs == [(1, "failed", "worker-lost"), (2, "completed", "")], runs
    assert Run.objects.get(job_id=own, attempt=2).host == "hostB"
    wait_for(lambda: not hostB.containers(), timeout=60, what="hostB's orphaned containers reaped")

    used, held = redis_conn_of_fleet.hmget(budget.usd_window_keys("all", drill.now())["day"], "used", "held")
    assert (int(used), int(held or 0)) == (4_000_000, 0)  # four attempts, each its whole $1 hold (no metering)


def test_the_real_pi_runs_on_a_host_of_its_own_through_its_gateway(drill):
    """The production image on hostA's own engine: pi reaches the model only through the job's gateway, which
    crosses hostA's link to the services' address, and its work becomes a pull request."""

    from devtools import jobimage
    from devtools.scripted_provider import ScriptedProvider
    from tests.hosts_support import SERVICES_ADDRESS

    hostA = drill.hosts["hostA"]
    image = jobimage.ensure_image(hostA.docker_host)  # imported from var/image-cache the first time (~20 s)
    model = ScriptedProvider(key="sk-ant-fleet-model-key", address=SERVICES_ADDRESS)
    try:
        vaults = declare_vaults(drill)
        label_triggers(drill.hosts)
        hostA.start_worker(drill.host_env(hostA, **vaults["hostA"], PI_JOB_IMAGE=image, PI_PROVIDER="anthropic",
                                          PI_PROVIDER_BASE_URL=model.url, ANTHROPIC_API_KEY=model.key,
                                          PI_MODEL="claude-sonnet-4-5", PI_JOB_MEMORY="1g"))
        wait_live("hostA")
        job_id = deliver_to(drill, "pi-hostA", 51, "Add a note.")
        wait_for(lambda: final_runs([job_id]), timeout=180, what="the real pi's run on hostA")
    finally:
        model.close()
    run = Run.objects.get(job_id=job_id)
    assert (run.outcome, run.host, run.publish_outcome) == (Outcome.COMPLETED, "hostA", "published")
    assert run.usage["source"] == "gateway" and run.tokens_total == sum(model.reported()) > 0
    assert all(seen.key_accepted for seen in model.seen)


def test_a_rolling_upgrade_of_one_host_loses_no_job(drill):
    """Two hosts under load; contrib/upgrade.sh drains hostA, applies the release's new migration (the database
    is put one migration back first), restarts hostA's workers and undrains it, while hostB keeps working and
    deliveries keep arriving: every delivery has exactly one completed run, none is lost, no container is left."""
    import subprocess
    import sys

    from django.db.migrations.recorder import MigrationRecorder

    from tests.hosts_support import ROOT

    vaults = declare_vaults(drill)
    label_triggers(drill.hosts)
    hostA, hostB = drill.hosts["hostA"], drill.hosts["hostB"]
    env = drill.base_env() | {"REDIS_URL": drill._loopback_redis(),
                              "DJANGO_SETTINGS_MODULE": "pidispatch_site.settings"}
    # One migration back, of a table no job's path touches (the pruned runs' project column): this release's own
    # workers run on both hosts, so the migration held back must be one they can run without.
    subprocess.run([sys.executable, "manage.py", "migrate", "insight", "0002", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    for host in (hostA, hostB):
        for _ in range(2):
            host.start_worker(drill.host_env(host, **vaults[host.name]))
    wait_live("hostA", "hostB")

    jobs, stop = [], threading.Event()

    def keep_delivering():
        number = 100
        while not stop.is_set():
            number += 1
            jobs.append(deliver_to(drill, "pi", number, "fake-agent:sleep=3"))
            time.sleep(1.5)

    load = threading.Thread(target=keep_delivering)
    load.start()
    try:
        time.sleep(5)
        upgrade = Upgrade(drill.host_env(hostA, **vaults["hostA"]) | {
            "PI_UPGRADE_PYTHON": sys.executable, "PI_UPGRADE_INSTALL": "true", "PI_UPGRADE_SKIP_IMAGE": "1",
            "PI_UPGRADE_DRAIN_WAIT": "120", "PI_UPGRADE_DOCTOR_WAIT": "120", "PI_UPGRADE_USER": "",
            "PI_UPGRADE_RESTART": hostA.restart_command()})
        upgrade.run("hostA", timeout=600)
        time.sleep(8)
    finally:
        stop.set()
        joined(load, 60, "the last delivery of the load")
    assert upgrade.returncode == 0, upgrade.output
    assert "==> hostA: upgraded to drill-release" in upgrade.output
    assert MigrationRecorder(connection()).migration_qs.filter(app="insight", name__startswith="0003").exists()

    wait_for(lambda: len(final_runs(jobs)) == len(jobs), timeout=180, what="every delivery's run")
    assert {job_id: runs for job_id, runs in final_runs(jobs).items() if runs != [("completed", "")]} == {}
    lost = Run.objects.filter(job_id__in=jobs, reason="worker-lost")
    assert not lost.exists(), "jobs lost in the upgrade:\n" + "\n".join(upgrade.explain(run) for run in lost)
    ran_on = set(Run.objects.filter(job_id__in=jobs).values_list("host", flat=True))
    assert ran_on == {"hostA", "hostB"}  # hostA worked before and after its upgrade
    assert all(worker.starts >= 2 for worker in hostA.workers)  # restarted by the upgrade
    wait_for(lambda: not hostA.containers() and not hostB.containers(), timeout=30, what="no container left")


class Upgrade:
    """contrib/upgrade.sh as the operator runs it, each step's line timed as it is printed: a job lost in the upgrade
    is then named with its host and the step the upgrade was at when the job started and when it was lost."""

    def __init__(self, env: dict):
        self.env = env
        self.steps: list[tuple[float, str]] = []  # (wall time, the step's line)
        self.output = ""
        self.returncode: int | None = None

    def run(self, host: str, timeout: float) -> None:
        import subprocess

        from tests.hosts_support import ROOT

        deadline = time.monotonic() + timeout
        process = subprocess.Popen(["contrib/upgrade.sh", host, "drill-release"], cwd=ROOT, env=self.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killer = threading.Timer(timeout, process.kill)  # its own deadline: a hung step ends the drill, named
        killer.start()
        try:
            for line in process.stdout:
                self.output += line
                if line.startswith("==> "):
                    self.steps.append((time.time(), line[4:].strip()))
            self.returncode = process.wait()
        finally:
            killer.cancel()
        if time.monotonic() >= deadline:
            self.output += f"\n(the upgrade was killed after {timeout:.0f} s)"

    def step_at(self, instant) -> str:
        at = instant.timestamp()
        passed = [line for when, line in self.steps if when <= at]
        return passed[-1] if passed else "before the upgrade began"

    def explain(self, run) -> str:
        return (f"  {run.job_id} attempt {run.attempt} on {run.host or 'no host'} ({run.queue}): started during "
                f"'{self.step_at(run.started_at)}', recorded lost during '{self.step_at(run.ended_at)}'")


def connection():
    from django.db import connection as default

    return default
