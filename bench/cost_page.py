"""The cost page over a long run history in PostgreSQL, beside a bare admin change list of the same table
(not part of CI):

    .venv/bin/python bench/cost_page.py [--runs 1000000] [--days 365] [--repeat 30] [--database-url postgres://...]

Seeds --runs run rows spread over --days (flows, hosts, repositories, trigger types and four models in each
run's usage ledger; one run in twelve an estimate, one in ten refused before spend), then times the page for
each window (7 days, 30 days, month to date) and prints p50 and p99 against the target of 300 ms, with the
closed days' partials kept (every view but the first after 6 h) and without (cold), and /metrics.

Without --database-url it starts a private Redis and a throwaway PostgreSQL cluster in a temporary folder
(as bench/fleet.py does) and removes both at the end.
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

TARGET_MS = 300


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]


def timed(function, repeat: int) -> tuple[float, float]:
    return percentiles(harness.samples_ms(function, repeat))


# Over bench/harness.py's rows: flows, hosts, repositories, trigger types and four models in each run's usage
# ledger; one run in twelve an estimate (the runner's claim), one in ten refused before spend.
COST_COLUMNS = {
    "target": "'acme/repo' || (n % 30) || '#' || (n % 500)", "scope": "'github:acme/repo' || (n % 30)",
    "flow": "'flow-' || (n % 8)", "trigger_type": "(ARRAY['label', 'comment', 'cron'])[1 + n % 3]",
    "host": "'host' || (n % 12)",
    "tokens_in": "CASE WHEN n % 10 = 0 THEN NULL ELSE 20000 END",
    "tokens_out": "CASE WHEN n % 10 = 0 THEN NULL ELSE 3000 END",
    "tokens_total": "CASE WHEN n % 10 = 0 THEN NULL ELSE 23000 END",
    "cost": "CASE WHEN n % 10 = 0 THEN NULL ELSE 0.01 + (n % 97) / 1000.0 END",
    "usage": """CASE WHEN n % 10 = 0 THEN NULL ELSE jsonb_build_object(
        'source', CASE WHEN n % 12 = 0 THEN 'runner' ELSE 'gateway' END,
        'models', jsonb_build_array(jsonb_build_object(
            'provider', 'anthropic', 'model', (ARRAY['claude-sonnet-4-5', 'claude-haiku-4-5',
                'claude-opus-4-1', 'claude-3-7-sonnet'])[1 + n % 4],
            'calls', 4, 'input', 20000, 'output', 3000, 'total', 23000,
            'cost', (0.01 + (n % 97) / 1000.0)::text))) END""",
}


def seed_runs(count: int, days: int) -> None:
    harness.seed_runs(count, days=days, columns=COST_COLUMNS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=365, help="how far back the seeded history reaches")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--database-url", help="a PostgreSQL URL to use (its database is created/reused)")
    args = parser.parse_args()

    with harness.private_services(args.database_url, DJANGO_ALLOWED_HOSTS="localhost"):
        return run(args)


def run(args) -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    harness.migrated_database()
    seed_runs(args.runs, args.days)

    User.objects.filter(username="bench").delete()
    User.objects.create_superuser("bench", password="bench-password-long")
    client = Client(HTTP_HOST="localhost")
    client.force_login(User.objects.get(username="bench"))
    per_day = args.runs / args.days
    print(f"\n{args.runs:,} run rows in PostgreSQL over {args.days} days (~{per_day:,.0f} a day), "
          f"{args.repeat} repetitions each\n")

    from apps.fleet.connection import get_redis

    redis = get_redis()

    def forget_partials():
        keys = list(redis.scan_iter("pidispatch:insight:day:*"))
        if keys:
            redis.delete(*keys)

    def cold(function, repeat):
        """Each sample after the kept partials are gone (a fresh Redis, or the first view after a day)."""
        samples = []
        for _ in range(repeat):
            forget_partials()
            started = time.perf_counter()
            function()
            samples.append((time.perf_counter() - started) * 1000)
        return percentiles(samples)

    baseline = timed(lambda: client.get("/admin/worker/run/"), args.repeat)
    print(f"{'baseline: admin change list of runs':<48} p50 {baseline[0]:8.2f} ms  p99 {baseline[1]:8.2f} ms")
    ok = True
    for window in ("7d", "30d", "mtd"):
        path = f"/admin/insight/spend/?window={window}"
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        queries = []  # counted in the request (Django empties its own query log when a request starts)

        def count(execute, sql, params, many, context, queries=queries):
            queries.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            client.get(path)
        measured = timed(lambda path=path: client.get(path), args.repeat)
        passed = measured[0] < TARGET_MS
        ok &= passed
        print(f"{'cost page ' + window + f' ({len(queries)} SQL queries)':<48} p50 {measured[0]:8.2f} ms  "
              f"p99 {measured[1]:8.2f} ms   target p50 < {TARGET_MS} ms: {'PASS' if passed else 'FAIL'}")
    for window in ("7d", "30d"):
        measured = cold(lambda window=window: client.get(f"/admin/insight/spend/?window={window}"),
                        max(3, args.repeat // 5))
        print(f"{'  cold (no kept partials) ' + window:<48} p50 {measured[0]:8.2f} ms  p99 {measured[1]:8.2f} ms")
    client.get("/metrics")
    metrics = timed(lambda: client.get("/metrics"), args.repeat)
    print(f"{'/metrics (whole history)':<48} p50 {metrics[0]:8.2f} ms  p99 {metrics[1]:8.2f} ms")
    metrics = cold(lambda: client.get("/metrics"), 3)
    print(f"{'  cold (no kept partials)':<48} p50 {metrics[0]:8.2f} ms  p99 {metrics[1]:8.2f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
