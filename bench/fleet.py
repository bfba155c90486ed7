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
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools import services  # noqa: E402


def start_postgres() -> tuple[str, callable]:
    folder = Path(tempfile.mkdtemp(prefix="pidispatch-bench-pg-"))  # beside, not inside, the 0700 scratch folder
    initdb = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not initdb:
        raise SystemExit("no PostgreSQL here: install it (apt-get install postgresql) or pass --database-url")
    bin_dir = initdb[-1].parent
    port = services.free_port()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(folder, "postgres")
    subprocess.run([*as_postgres, str(bin_dir / "initdb"), "-D", str(folder / "data"), "-A", "trust", "-U", "postgres"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(folder / "data"), "-l", str(folder / "log"), "-w",
                    "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, stdout=subprocess.DEVNULL)

    def stop():
        subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(folder / "data"), "-m", "fast", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(folder, ignore_errors=True)

    return f"postgres://postgres@127.0.0.1:{port}/pidispatch_bench", stop


def timed(function, repeat: int) -> tuple[float, float]:
    """(median, p90) in milliseconds."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
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


# How the seeded rows vary (SQL over n = 1..count); every other column takes its field's default, so a field
# added to Run later never breaks the seeding.
SEEDED_COLUMNS = {
    "job_id": "'gh-bench-' || n", "attempt": "1", "kind": "'github'", "target": "'acme/web#' || (n % 500)",
    "scope": "'github:acme/web'", "flow": "'fix-bug'", "trigger_type": "'label'", "delivery_id": "'bench-' || n",
    "host": "'host' || (n % 100)", "queue": "'pi-jobs'", "image": "'pi-job:latest'",
    "started_at": "now() - (n * interval '1 second' * (365 * 86400.0 / {count}))",
    "ended_at": "now() - (n * interval '1 second' * (365 * 86400.0 / {count})) + interval '5 minutes'",
    "outcome": "CASE WHEN n % 10 = 0 THEN 'policy' WHEN n % 17 = 0 THEN 'failed' ELSE 'completed' END",
    "reason": "CASE WHEN n % 10 = 0 THEN 'over-budget' WHEN n % 17 = 0 THEN 'runner-infra' ELSE '' END",
    "exit_code": "0", "turns": "12", "tokens_in": "20000", "tokens_out": "3000", "tokens_total": "23000",
    "cost": "0.05", "budget_reserved": "n % 10 <> 0",
}


def seed_runs(count: int) -> None:
    from django.db import connection

    from apps.worker.models import Run

    if Run.objects.count() == count:
        return
    print(f"seeding {count:,} run rows (a year of history) ...", flush=True)
    started = time.perf_counter()
    columns, expressions, params = [], [], []
    for field in Run._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.name in SEEDED_COLUMNS:
            expressions.append(SEEDED_COLUMNS[field.name].format(count=int(count)).replace("%", "%%"))
        else:
            expressions.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Run._meta.db_table} RESTART IDENTITY")
        cursor.execute(f"INSERT INTO {Run._meta.db_table} ({', '.join(columns)}) "
                       f"SELECT {', '.join(expressions)} FROM generate_series(1, %s) AS n", [*params, count])
        cursor.execute(f"ANALYZE {Run._meta.db_table}")
    print(f"seeded in {time.perf_counter() - started:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--database-url", help="a PostgreSQL URL to use (its database is created/reused)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="pidispatch-bench-"))
    stops = []
    try:
        redis_service = services.start_redis(scratch / "redis", services.free_port(), persistent=False)
        stops.append(redis_service.stop)
        database_url = args.database_url
        if not database_url:
            database_url, stop_pg = start_postgres()
            stops.append(stop_pg)
        os.environ.update(REDIS_URL=redis_service.env["REDIS_URL"], DATABASE_URL=database_url,
                          DJANGO_SETTINGS_MODULE="pidispatch_site.settings", PI_LOG_LEVEL="WARNING",
                          DJANGO_ALLOWED_HOSTS="localhost")
        return run(args)
    finally:
        for stop in reversed(stops):
            stop()
        shutil.rmtree(scratch, ignore_errors=True)


def run(args) -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from apps.fleet import pauses, registry
    from apps.fleet.connection import get_redis
    from apps.fleet.union import register_queues, resolve_scope

    dbname = connection.settings_dict["NAME"]
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname])
        if not cursor.fetchone():
            cursor.execute(f'CREATE DATABASE "{dbname}"')
    call_command("migrate", verbosity=0)
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
    seed_runs(args.runs)

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
