"""Fleet benchmarks, each beside its baseline in the same run (not part of CI):

1. pause-all and resume-all over the queue union of 100 declared hosts (101 queues), through the same
   service the command and the panel call, against a baseline of one plain SET per queue;
   target: pause-all under 100 ms;
2. the admin fleet panel's render time with 100 host rows in the registry and 1,000,000 run rows in
   PostgreSQL (spread over a year), against a bare admin change list of the same table;
   target: the panel under 300 ms.

    .venv/bin/python bench/fleet.py [--hosts 100] [--runs 1000000] [--repeat 15] [--database-url postgres://...]

`--simulated` measures a fleet of `--hosts` simulated hosts instead: each with two worker processes in the
registry (one busy), a host queue with a job waiting, capabilities to route by, and heartbeats at the real
cadence from a process of their own; a tenth of them dead (half stale, half gone, one of those with its queue
paused). Pause-all, resume-all, routing (a cold registry read each time), the fleet panel and `fleet status`
are each timed beside a baseline, at a tenth of the hosts and at all of them, and the difference gives each
one's cost per host. Targets: pause-all under 100 ms, the panel under 300 ms.

    .venv/bin/python bench/fleet.py --simulated [--hosts 100] [--runs 1000000] [--repeat 15]

Without --database-url it starts a private Redis and a throwaway PostgreSQL cluster (initdb, as the
`postgres` user when run as root) in a temporary folder, and removes both at the end.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402


def timed(function, repeat: int) -> tuple[float, float]:
    """(median, p90) in milliseconds."""
    samples = harness.samples_ms(function, repeat)
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def report(name: str, measured: tuple[float, float], baseline_name: str, baseline: tuple[float, float],
           target_ms: float | None = None) -> bool:
    ratio = measured[0] / baseline[0] if baseline[0] else float("inf")
    verdict = ""
    ok = True
    if target_ms is not None:
        ok = measured[0] < target_ms
        verdict = f"   target < {target_ms:.0f} ms: {'PASS' if ok else 'FAIL'}"
    print(f"{name:<44} median {measured[0]:8.2f} ms  p90 {measured[1]:8.2f} ms")
    print(f"{'  baseline: ' + baseline_name:<44} median {baseline[0]:8.2f} ms  p90 {baseline[1]:8.2f} ms")
    print(f"{'  ratio':<44} {ratio:8.2f}x{verdict}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--database-url", help="a PostgreSQL URL to use (its database is created/reused)")
    parser.add_argument("--simulated", action="store_true",
                        help="a simulated fleet of --hosts hosts, a tenth dead: every fleet operation and its cost "
                             "per host")
    args = parser.parse_args()

    with harness.private_services(args.database_url, DJANGO_ALLOWED_HOSTS="localhost"):
        return run_simulated(args) if args.simulated else run(args)


def run(args) -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.test import Client

    from apps.fleet import pauses, registry
    from apps.fleet.connection import get_redis
    from apps.fleet.union import register_queues, resolve_scope

    harness.migrated_database()
    redis = get_redis()
    redis.flushdb()
    for index in range(args.hosts):
        name = f"host{index:03d}"
        registry.publish(redis, registry.HostFacts(name=name, declared=True, version="0.1.0", image="pi-job:latest",
                                                   capabilities=("wait:ci-green",)),
                         registry.ProcessFacts(worker_name=f"w-{name}", pid=1, proc="bench/ns/1/1",
                                               started_at=time.time(), queues=("pi-jobs", f"pi-jobs@{name}"),
                                               job=registry.RunningJob(f"gh-{index}", time.time(), "acme/web#1",
                                                                       "pi-jobs")))
        register_queues(redis, [f"pi-jobs@{name}"])
    harness.seed_runs(args.runs)

    queues, _ = resolve_scope(redis, all_queues=True)
    print(f"\n{len(queues)} queues in the union, {args.hosts} host rows, {args.runs:,} run rows "
          f"(PostgreSQL), {args.repeat} repetitions each\n")

    def pause_all():
        union, degraded = resolve_scope(redis, all_queues=True)
        result = pauses.pause(redis, union, by="bench", note="bench", degraded=degraded)
        assert result.ok and len(result.changed) == len(queues)

    def resume_all():
        union, degraded = resolve_scope(redis, all_queues=True)
        assert pauses.resume(redis, union, by="bench", degraded=degraded).ok

    def set_per_queue():
        for queue in queues:
            redis.set(f"bench:pause:{queue}", "1")

    baseline = timed(set_per_queue, args.repeat)
    # Timed alone: each sample pauses (resume runs between samples, outside the measurement).
    pause_samples, resume_samples = [], []
    for _ in range(args.repeat):
        started = time.perf_counter()
        pause_all()
        pause_samples.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        resume_all()
        resume_samples.append((time.perf_counter() - started) * 1000)

    def summary(samples):
        samples = sorted(samples)
        return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]

    ok = report("pause-all (union + flags + audit row)", summary(pause_samples), "one SET per queue", baseline, 100)
    report("resume-all (union + flags + audit row)", summary(resume_samples), "one SET per queue", baseline)

    User.objects.filter(username="bench").delete()
    User.objects.create_superuser("bench", password="bench-password-long")
    client = Client(HTTP_HOST="localhost")
    client.force_login(User.objects.get(username="bench"))
    for path in ("/admin/fleet/fleetpanel/", "/admin/worker/run/"):
        assert client.get(path).status_code == 200, path  # warm both up
    panel = timed(lambda: client.get("/admin/fleet/fleetpanel/"), args.repeat)
    changelist = timed(lambda: client.get("/admin/worker/run/"), args.repeat)
    print()
    ok &= report("fleet panel (100 hosts, 1M runs)", panel, "admin change list of runs", changelist, 300)
    return 0 if ok else 1


# --- a simulated fleet ---------------------------------------------------------------------------------

PROCESSES_PER_HOST = 2
DEAD_SHARE = 0.1


def host_name(index: int) -> str:
    return f"host{index:03d}"


def host_facts(index: int):
    from apps.fleet import registry

    capabilities = ("wait:ci-green",) if index % 2 == 0 else ("secrets:vault", "wait:ci-green")
    return registry.HostFacts(name=host_name(index), declared=True, version="0.1.0", image="pi-job:latest",
                              capabilities=capabilities, concurrency=PROCESSES_PER_HOST)


def process_facts(index: int, process: int):
    from apps.fleet import registry

    name = host_name(index)
    busy = (registry.RunningJob(f"gh-{index}-{process}", time.time() - 60, "acme/web#1", "pi-jobs") if process == 0
            else None)
    return registry.ProcessFacts(worker_name=f"w-{name}-{process}", pid=1000 + process, proc="bench/ns/1/1",
                                 started_at=time.time() - 3600, queues=("pi-jobs", f"pi-jobs@{name}"), job=busy)


def dead_hosts(hosts: int) -> tuple[set[int], set[int]]:
    """(stale, gone): a tenth of the fleet, half whose beat is older than PI_FLEET_LIVE_SECONDS and half whose
    registry row has expired (still in the index and RQ's queue set)."""
    dead = list(range(hosts - max(1, round(hosts * DEAD_SHARE)), hosts))
    return set(dead[: len(dead) // 2]), set(dead[len(dead) // 2:])


def simulate_fleet(redis, hosts: int) -> list[int]:
    """The fleet's Redis state, from scratch; the live hosts' indexes."""
    from django.conf import settings

    from apps.fleet import pauses, registry
    from apps.fleet.union import register_queues
    from apps.worker.jobs import JobSpec, enqueue

    for key in redis.scan_iter("pidispatch:*", count=1000):
        redis.delete(key)
    for key in redis.scan_iter("rq:*", count=1000):
        redis.delete(key)
    stale, gone = dead_hosts(hosts)
    now = time.time()
    live = []
    for index in range(hosts):
        beat = now - (settings.PI_FLEET_LIVE_SECONDS + 15) if index in stale | gone else now
        for process in range(PROCESSES_PER_HOST):
            registry.publish(redis, host_facts(index), process_facts(index, process), now=beat)
        register_queues(redis, [f"pi-jobs@{host_name(index)}"])
        enqueue(JobSpec(job_id=f"gh-waiting-{index}", kind="github", repo="acme/web", target_type="issue",
                        number=index + 1, flow="fix-bug"), f"pi-jobs@{host_name(index)}")
        if index in gone:  # its rows expired; the index and RQ's queue set remember it
            redis.delete(registry.host_key(host_name(index)), registry.host_workers_key(host_name(index)),
                         *(registry.worker_key(f"w-{host_name(index)}-{p}") for p in range(PROCESSES_PER_HOST)))
        elif index not in stale:
            live.append(index)
    if gone:  # a dead host's paused queue stays in the union and has to be resumable
        pauses.pause(redis, [f"pi-jobs@{host_name(min(gone))}"], by="bench", note="disk swap")
    return live


def beat_forever(redis_url: str, live: list[int], beat_seconds: float) -> None:
    """The live hosts' worker processes beating at the real cadence, from a process of their own (as other
    machines would: it loads Redis, not the measuring process)."""
    import django
    import redis as redis_client

    django.setup()
    from apps.fleet import registry

    connection = redis_client.Redis.from_url(redis_url)
    beats = [(index, process) for index in live for process in range(PROCESSES_PER_HOST)]
    pause = beat_seconds / max(1, len(beats))
    while True:
        for index, process in beats:
            registry.publish(connection, host_facts(index), process_facts(index, process))
            time.sleep(pause)


def run_simulated(args) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connections
    from django.test import Client

    from apps.fleet import pauses, registry, routing
    from apps.fleet.connection import get_redis
    from apps.fleet.union import queue_union, resolve_scope

    harness.migrated_database()
    harness.seed_runs(args.runs)
    redis = get_redis()
    settings.PI_FLEET_ROUTE_CACHE_SECONDS = 0  # every routing decision reads the registry: its cold cost
    User.objects.filter(username="bench").delete()
    User.objects.create_superuser("bench", password="bench-password-long")
    client = Client(HTTP_HOST="localhost")
    client.force_login(User.objects.get(username="bench"))

    sizes = sorted({max(2, args.hosts // 10), args.hosts})
    results: dict[str, dict[int, tuple]] = {}
    for hosts in sizes:
        live = simulate_fleet(redis, hosts)
        connections.close_all()  # the beating process is forked: it must not share the database socket
        beating = multiprocessing.get_context("fork").Process(
            target=beat_forever, args=(os.environ["REDIS_URL"], live, settings.PI_FLEET_BEAT_SECONDS), daemon=True)
        beating.start()
        try:
            union = queue_union(redis)
            rows = {h.liveness for h in union.hosts}
            assert len(union.queues) == hosts + 1 and "live" in rows and "gone" in rows, (len(union.queues), rows)
            queues = list(union.queues)
            host_keys = [registry.host_key(host_name(index)) for index in range(hosts)]

            def pause_all():
                found, degraded = resolve_scope(redis, all_queues=True)
                assert pauses.pause(redis, found, by="bench", note="bench", degraded=degraded).ok

            def resume_all():
                found, degraded = resolve_scope(redis, all_queues=True)
                assert pauses.resume(redis, found, by="bench", degraded=degraded).ok

            def set_per_queue(queues=queues):
                for queue in queues:
                    redis.set(f"bench:pause:{queue}", "1")

            def route():
                assert routing.queue_for(frozenset({"secrets:vault", "wait:ci-green"}), job_id="gh-route") != "pi-jobs"

            def read_host_rows(host_keys=host_keys):
                pipe = redis.pipeline(transaction=False)
                for key in host_keys:
                    pipe.hgetall(key)
                pipe.execute()

            def fleet_status():
                call_command("fleet", "status", stdout=io.StringIO())

            def queue_lengths(queues=queues):
                pipe = redis.pipeline(transaction=False)
                for queue in queues:
                    pipe.llen(f"rq:queue:{queue}")
                pipe.execute()

            pause_samples, resume_samples = [], []
            for _ in range(args.repeat):  # each pause timed alone: its resume runs between the samples
                started = time.perf_counter()
                pause_all()
                pause_samples.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                resume_all()
                resume_samples.append((time.perf_counter() - started) * 1000)
            pauses.pause(redis, [f"pi-jobs@{host_name(min(dead_hosts(hosts)[1]))}"], by="bench", note="disk swap")
            for path in ("/admin/fleet/fleetpanel/", "/admin/worker/run/"):
                assert client.get(path).status_code == 200, path  # warm both up
            results.setdefault("pause-all", {})[hosts] = (summary(pause_samples), timed(set_per_queue, args.repeat))
            results.setdefault("resume-all", {})[hosts] = (summary(resume_samples), timed(set_per_queue, args.repeat))
            results.setdefault("routing", {})[hosts] = (timed(route, args.repeat), timed(read_host_rows, args.repeat))
            results.setdefault("fleet panel", {})[hosts] = (
                timed(lambda: client.get("/admin/fleet/fleetpanel/"), args.repeat),
                timed(lambda: client.get("/admin/worker/run/"), args.repeat))
            results.setdefault("fleet status", {})[hosts] = (timed(fleet_status, args.repeat),
                                                             timed(queue_lengths, args.repeat))
        finally:
            beating.terminate()
            beating.join()

    big, small = sizes[-1], sizes[0]
    stale, gone = dead_hosts(big)
    print(f"\n{big} simulated hosts ({big - len(stale) - len(gone)} live, {len(stale)} stale, {len(gone)} gone), "
          f"{PROCESSES_PER_HOST} worker processes each beating every {settings.PI_FLEET_BEAT_SECONDS:g} s, "
          f"{big + 1} queues, {args.runs:,} run rows (PostgreSQL), {args.repeat} repetitions each\n")
    baselines = {"pause-all": "one SET per queue", "resume-all": "one SET per queue",
                 "routing": "one pipelined HGETALL per host row", "fleet panel": "admin change list of runs",
                 "fleet status": "one pipelined LLEN per queue"}
    targets = {"pause-all": 100, "fleet panel": 300}
    ok = True
    for name, by_size in results.items():
        measured, baseline = by_size[big]
        ok &= report(f"{name} ({big} hosts)", measured, baselines[name], baseline, targets.get(name))
        per_host = (measured[0] - by_size[small][0][0]) / (big - small) if big > small else float("nan")
        base_per_host = (baseline[0] - by_size[small][1][0]) / (big - small) if big > small else float("nan")
        print(f"{'  per host (' + str(small) + ' -> ' + str(big) + ' hosts)':<44} {per_host:8.3f} ms"
              f"   baseline {base_per_host:8.3f} ms   at {small} hosts: median {by_size[small][0][0]:.2f} ms\n")
    return 0 if ok else 1


def summary(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


if __name__ == "__main__":
    sys.exit(main())
