"""Housekeeping's prune over a long run history in PostgreSQL, beside its baseline (not part of CI): what the
run-record writes of working workers feel while a year's backlog of runs is deleted in batches.

    .venv/bin/python bench/housekeeping.py [--runs 1000000] [--days 730] [--batch-size 1000] [--pause 0]
                                           [--seconds 15] [--single-delete] [--database-url postgres://...]

Seeds --runs run rows spread over --days (bench/harness.py), so with PI_RUN_RETENTION_DAYS at 365 about half of a
730-day history is past its retention. A writer in a process of its own inserts one run record at a time (a plain
single-row INSERT into the same table, autocommit, one every 5 ms) and times each: first for --seconds with no
prune (the baseline), then while `apps.worker.housekeeping.housekeep` prunes the backlog, as `manage.py
housekeeping` does, in batches of --batch-size (each batch its own transaction: the time it holds its rows' locks
is timed too). Then the next day's prune (one more day past the line) is timed. --single-delete also reseeds and
times what the batches avoid, one DELETE of the whole past in one transaction, with the writer beside it.

Without --database-url it starts a private Redis and a throwaway PostgreSQL cluster (as bench/cost_page.py does)
and removes both at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

WRITE_EVERY_SECONDS = 0.005


def percentile(samples: list[float], share: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, round(share * (len(samples) - 1)))] if samples else float("nan")


def line(name: str, samples_ms: list[float], extra: str = "") -> str:
    return (f"{name:<44} n={len(samples_ms):>6,}  p50 {statistics.median(samples_ms):7.2f} ms  "
            f"p99 {percentile(samples_ms, 0.99):7.2f} ms  max {max(samples_ms):8.2f} ms{extra}")


# --- the writer: its own process, one run record at a time -------------------------------------------------

def writer() -> int:
    """Insert run records until SIGTERM; print each one's latency (ms) as a JSON list."""
    import django

    django.setup()
    from django.utils import timezone

    from apps.worker.models import Run

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    latencies = []
    index = 0
    while not stop:
        now = timezone.now()
        row = Run(job_id=f"gh-bench-writer-{os.getpid()}-{index}", kind="github", target="acme/web#1",
                  scope="github:acme/web", flow="fix-bug", host="hostW", queue="pi-jobs", started_at=now,
                  ended_at=now, outcome="completed", cost="0.05", tokens_total=23000)
        started = time.perf_counter()
        Run.objects.bulk_create([row])  # one INSERT, autocommit, as a run's record write (no signal)
        latencies.append((time.perf_counter() - started) * 1000)
        index += 1
        time.sleep(WRITE_EVERY_SECONDS)
    print(json.dumps(latencies))
    return 0


class Writer:
    def __init__(self):
        self.process = subprocess.Popen([sys.executable, __file__, "--writer"], cwd=ROOT, stdout=subprocess.PIPE,
                                        text=True, env=os.environ.copy())
        time.sleep(1.5)  # Django's start, before the measured part begins

    def stop(self) -> list[float]:
        self.process.send_signal(signal.SIGTERM)
        output, _ = self.process.communicate(timeout=60)
        return json.loads(output)


# --- the run -----------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=730, help="how far back the seeded history reaches")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--pause", type=float, default=None, help="seconds between batches (default: none on "
                        "PostgreSQL, as `manage.py housekeeping`)")
    parser.add_argument("--seconds", type=float, default=15, help="how long the baseline writes")
    parser.add_argument("--single-delete", action="store_true",
                        help="also reseed and time one DELETE of the whole past (what the batches avoid)")
    parser.add_argument("--database-url", help="a PostgreSQL URL to use (its database is created/reused)")
    parser.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        return writer()
    with harness.private_services(args.database_url, PI_RUN_RETENTION_DAYS="365"):
        return run(args)


def run(args) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from apps.fleet.connection import get_redis
    from apps.insight.models import PrunedRuns
    from apps.worker import housekeeping
    from apps.worker.models import Run

    harness.migrated_database()
    harness.seed_runs(args.runs, days=args.days)
    PrunedRuns.objects.all().delete()
    redis = get_redis()
    redis.delete(housekeeping.LOCK_KEY)
    cutoff = housekeeping.run_cutoff(timezone.now())
    past = Run.objects.started_before(cutoff).count()
    print(f"\n{args.runs:,} run rows in PostgreSQL over {args.days} days; {past:,} started before {cutoff:%Y-%m-%d} "
          f"(PI_RUN_RETENTION_DAYS={settings.PI_RUN_RETENTION_DAYS}); batches of {args.batch_size:,}, "
          f"pause {args.pause or 0} s\n")

    baseline = Writer()
    time.sleep(args.seconds)
    quiet = baseline.stop()
    print(line("baseline: run-record INSERT, no prune", quiet))

    batches: list[float] = []
    real_batch = housekeeping._batch

    def timed_batch(rule, *batch_args):
        started = time.perf_counter()
        try:
            return real_batch(rule, *batch_args)
        finally:
            if rule.name == "runs":
                batches.append((time.perf_counter() - started) * 1000)

    housekeeping._batch = timed_batch
    busy = Writer()
    started = time.perf_counter()
    report = housekeeping.housekeep(redis, how="bench", batch=args.batch_size, pause=args.pause)
    took = time.perf_counter() - started
    during = busy.stop()
    deleted = report.deleted["runs"]
    print(line("run-record INSERT during the prune", during,
               f"   p99 {percentile(during, 0.99) / percentile(quiet, 0.99):.2f}x the baseline's"))
    print(f"{'prune: runs deleted':<44} {deleted:,} in {took:.1f} s ({deleted / took:,.0f}/s), "
          f"{len(batches):,} batches of runs")
    print(line("  each batch's transaction (its locks held)", batches))
    print(f"{'SUMMARY':<44} longest batch held its locks {max(batches):.1f} ms; the prune took {took:.1f} s in all")

    settings.PI_RUN_RETENTION_DAYS = 364  # the next day: one more day past the line
    batches.clear()
    started = time.perf_counter()
    report = housekeeping.housekeep(redis, how="bench", batch=args.batch_size, pause=args.pause)
    took = time.perf_counter() - started
    print(f"{'the next day: runs deleted':<44} {report.deleted['runs']:,} in {took:.2f} s, {len(batches)} batch(es)")
    housekeeping._batch = real_batch

    if args.single_delete:
        settings.PI_RUN_RETENTION_DAYS = 365
        print("\nreseeding for one DELETE of the whole past ...")
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {Run._meta.db_table} RESTART IDENTITY CASCADE")
        harness.seed_runs(args.runs, days=args.days)
        cutoff = housekeeping.run_cutoff(timezone.now())
        busy = Writer()
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {Run._meta.db_table} WHERE started_at < %s", [cutoff])
            gone = cursor.rowcount
        took = time.perf_counter() - started
        during = busy.stop()
        print(line("run-record INSERT during one DELETE", during,
                   f"   p99 {percentile(during, 0.99) / percentile(quiet, 0.99):.2f}x the baseline's"))
        print(f"{'one DELETE: runs deleted':<44} {gone:,} in {took:.1f} s, in one transaction holding every "
              "row's lock")
    return 0


if __name__ == "__main__":
    sys.exit(main())
