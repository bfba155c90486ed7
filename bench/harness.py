"""What the benchmarks share: a private Redis and a throwaway PostgreSQL for the run, a migrated database,
and a year of seeded run rows."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from devtools import services


@contextmanager
def private_services(database_url: str | None, **environment):
    """A private Redis, and (without `database_url`) a throwaway PostgreSQL, for as long as the block runs;
    the process environment points Django at both."""
    scratch = Path(tempfile.mkdtemp(prefix="pidispatch-bench-"))
    stops = []
    try:
        redis_service = services.start_redis(scratch / "redis", services.free_port(), persistent=False)
        stops.append(redis_service.stop)
        if not database_url:
            database_url, stop_pg = start_postgres()
            stops.append(stop_pg)
        os.environ.update(REDIS_URL=redis_service.env["REDIS_URL"], DATABASE_URL=database_url,
                          DJANGO_SETTINGS_MODULE="pidispatch_site.settings", PI_LOG_LEVEL="WARNING",
                          PI_VAR_DIR=str(scratch / "var"), **environment)
        yield
    finally:
        for stop in reversed(stops):
            stop()
        shutil.rmtree(scratch, ignore_errors=True)


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


def samples_ms(function, repeat: int) -> list[float]:
    """`function` timed `repeat` times, in milliseconds, sorted."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return sorted(samples)


def migrated_database() -> None:
    """The database of DATABASE_URL, created if missing, migrated (call after django.setup())."""
    from django.core.management import call_command
    from django.db import connection

    dbname = connection.settings_dict["NAME"]
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname])
        if not cursor.fetchone():
            cursor.execute(f'CREATE DATABASE "{dbname}"')
    call_command("migrate", verbosity=0)


# How the seeded rows vary (SQL over n = 1..count); every other column takes its field's default, so a field
# added to Run later never breaks the seeding.
SEEDED_COLUMNS = {
    "job_id": "'gh-bench-' || n", "attempt": "1", "kind": "'github'", "target": "'acme/web#' || (n % 500)",
    "scope": "'github:acme/web'", "flow": "'fix-bug'", "trigger_type": "'label'", "delivery_id": "'bench-' || n",
    "host": "'host' || (n % 100)", "queue": "'pi-jobs'", "image": "'pi-job:latest'",
    "started_at": "now() - (n * interval '1 second' * ({days} * 86400.0 / {count}))",
    "ended_at": "now() - (n * interval '1 second' * ({days} * 86400.0 / {count})) + interval '5 minutes'",
    "outcome": "CASE WHEN n % 10 = 0 THEN 'policy' WHEN n % 17 = 0 THEN 'failed' ELSE 'completed' END",
    "reason": "CASE WHEN n % 10 = 0 THEN 'over-budget' WHEN n % 17 = 0 THEN 'runner-infra' ELSE '' END",
    "exit_code": "0", "turns": "12", "tokens_in": "20000", "tokens_out": "3000", "tokens_total": "23000",
    "cost": "0.05", "budget_reserved": "n % 10 <> 0",
}


def seed_runs(count: int, *, days: int = 365, columns: dict[str, str] | None = None) -> None:
    """`count` run rows over the last `days`, varied as SEEDED_COLUMNS (and `columns` over it) say."""
    from django.db import connection

    from apps.worker.models import Run

    if Run.objects.count() == count:
        return
    seeded = {**SEEDED_COLUMNS, **(columns or {})}
    print(f"seeding {count:,} run rows over {days} days ...", flush=True)
    started = time.perf_counter()
    columns, expressions, params = [], [], []
    for field in Run._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.name in seeded:
            expressions.append(seeded[field.name].format(count=int(count), days=int(days)).replace("%", "%%"))
        else:
            expressions.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Run._meta.db_table} RESTART IDENTITY CASCADE")
        cursor.execute(f"INSERT INTO {Run._meta.db_table} ({', '.join(columns)}) "
                       f"SELECT {', '.join(expressions)} FROM generate_series(1, %s) AS n", [*params, count])
        cursor.execute(f"ANALYZE {Run._meta.db_table}")
    print(f"seeded in {time.perf_counter() - started:.1f} s")
