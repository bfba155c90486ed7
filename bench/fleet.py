"""Fleet benchmarks, each beside its baseline in the same run (not part of CI):

1. pause-all and resume-all over the queue union of 100 declared hosts (101 queues), through the same
   service the command and the panel call, against a baseline of one plain SET per queue;
   target: pause-all under 100 ms;
2. the admin fleet panel's render time with 100 host rows in the registry and 1,000,000 run rows in
   PostgreSQL (spread over a year), against a bare admin change list of the same table;
   target: the panel under 300 ms.

    .venv/bin/python bench/fleet.py [--hosts 100] [--runs 1000000] [--repeat 15] [--database-url postgres://...]

Without --database-url it starts a private Redis and a throwaway PostgreSQL cluster (initdb, as the
`postgres` user when run as root) in a temporary folder, and removes both at the end.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()

    with harness.private_services(args.database_url, DJANGO_ALLOWED_HOSTS="localhost"):
        return run(args)


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
                                               job=registry.RunningJob(f"gh-{index}", time.time(), "acme/web#1", "pi-jobs")))
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


if __name__ == "__main__":
    sys.exit(main())
