"""Redis loss benchmark, beside its baseline in the same run (not part of CI):

the time from a Redis that came back empty to a fully rebuilt state (issue 48): every open accepted job queued again
(apps/worker/accepted.py::reconcile) and the budget windows rebuilt from the run records and the attempts in flight
(apps/worker/gates/budget_rebuild.py::rebuild), with 10,000 open accepted rows (1% of them running) and a month of
1,000,000 run records in PostgreSQL; against the least such a rebuild could cost: RQ's own `enqueue_many` of the
same 10,000 payloads into an empty Redis (one pipeline, no database). Target: under 10 s; no job is admitted before
it ends (the ladder's gate 10c waits for it, which tests/fleet/test_redis_loss.py proves).

    .venv/bin/python bench/redis_loss.py [--runs 1000000] [--accepted 10000] [--database-url postgres://...]

Without --database-url it starts a private Redis and a throwaway PostgreSQL cluster and removes both at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

TARGET_SECONDS = 10.0
LEDGERS = {  # where the seeded runs counted: a third under a scoped limit's windows as well as the deployment's
    "ledgers": "CASE WHEN n % 3 = 0 THEN '{{\"jobs\": [\"s:0123456789abcdef\", \"all\"], \"usd\": [\"all\"]}}'::jsonb "
               "ELSE '{{\"jobs\": [\"all\"], \"usd\": [\"all\"]}}'::jsonb END",
    "dollars_reserved": "1", "dollars_charged": "0.05", "dollar_basis": "'metered'",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--accepted", type=int, default=10_000)
    parser.add_argument("--database-url", help="a PostgreSQL URL to use (its database is created/reused)")
    args = parser.parse_args()
    with harness.private_services(args.database_url, PI_DAILY_CAP="100000", PI_MAX_COST_USD="1",
                                  PI_DAILY_COST_USD="100000"):
        return run(args)


def seed_accepted(count: int) -> None:
    """`count` open accepted jobs, each a forge job's payload under its own id; one in a hundred running (it took
    its budget)."""
    from django.db import connection

    from apps.worker.jobs import JobSpec
    from apps.worker.models import AcceptedJob

    template = JobSpec(job_id="x", kind="github", repo="acme/web", number=7, target_type="issue", flow="fix-bug",
                       title="A bug", body="Please fix it.").to_payload()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {AcceptedJob._meta.db_table} RESTART IDENTITY")
        cursor.execute(
            f"INSERT INTO {AcceptedJob._meta.db_table} (job_id, queue, payload, accepted_at, started_attempt, "
            "started_at, spending_since, settled_at, rebuilt) SELECT 'gh-accepted-' || n, 'pi-jobs', "
            "jsonb_set(%s::jsonb, '{job_id}', to_jsonb('gh-accepted-' || n)), now(), "
            "CASE WHEN n %% 100 = 0 THEN 1 ELSE 0 END, CASE WHEN n %% 100 = 0 THEN now() END, "
            "CASE WHEN n %% 100 = 0 THEN now() END, NULL, 0 "
            "FROM generate_series(1, %s) AS n", [json.dumps(template), count])


def run(args) -> int:
    import django

    django.setup()
    from django.utils import timezone
    from rq import Queue

    from apps.fleet.connection import get_redis
    from apps.worker import accepted
    from apps.worker.gates import budget_rebuild
    from apps.worker.models import AcceptedJob
    from apps.worker.tasks import execute_job

    harness.migrated_database()
    harness.seed_runs(args.runs, days=30, columns=LEDGERS)
    seed_accepted(args.accepted)
    redis = get_redis()

    redis.flushdb()  # Redis came back empty
    started_at = time.perf_counter()
    rebuilt = accepted.reconcile(redis)
    reconciled = time.perf_counter()
    budget_rebuild.ensure_rebuilt(redis, timezone.now())
    measured = time.perf_counter() - started_at
    running = AcceptedJob.objects.filter(started_at__isnull=False).count()
    assert rebuilt == args.accepted - running, f"rebuilt {rebuilt} of {args.accepted - running}"

    payloads = list(AcceptedJob.objects.values_list("job_id", "payload"))
    redis.flushdb()
    queue = Queue("pi-jobs", connection=redis)
    started = time.perf_counter()
    queue.enqueue_many([Queue.prepare_data(execute_job, args=(payload,), job_id=job_id)
                        for job_id, payload in payloads])
    baseline = time.perf_counter() - started

    ok = measured < TARGET_SECONDS
    print(f"{'rebuild after an empty Redis':<44} {measured:7.2f} s")
    print(f"{'  of which the jobs queued again':<44} {reconciled - started_at:7.2f} s  "
          f"({rebuilt:,} queued again; {running} running, left to their workers)")
    print(f"{'  of which the budget windows':<44} {measured - (reconciled - started_at):7.2f} s")
    print(f"{'  baseline: RQ enqueue_many, same payloads':<44} {baseline:7.2f} s")
    print(f"{'  ratio':<44} {measured / baseline if baseline else float('inf'):7.2f}x   "
          f"target < {TARGET_SECONDS:g} s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
