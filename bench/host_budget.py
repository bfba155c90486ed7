"""Host budget benchmark, beside its baseline in the same run (not part of CI):

one admission decision of gate 5b (apps/worker/gates/host_budget.py::decide: the host's ledger read, the waiter's
place kept, the holds ranked and the fit checked, in one Redis script) on a host with 100 waiting jobs across ten
projects (some below their minJobs) and 8 running, for a job that does not fit (the whole line is ranked) and for
one that does; against the least such a decision reads: one HGETALL of the same 100-waiter hash. Target: p99 under
5 ms.

    .venv/bin/python bench/host_budget.py [--waiting 100] [--repeat 2000]

It starts a private Redis (and an SQLite database nothing reads) and removes both at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

TARGET_MS = 5.0
HOST = "hostB"


def percentiles(function, repeat: int) -> tuple[float, float]:
    samples = harness.samples_ms(function, repeat)
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(0.99 * len(samples)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    database = Path(tempfile.mkdtemp(prefix="pidispatch-bench-db-")) / "bench.sqlite3"
    with harness.private_services(f"sqlite:///{database}"):
        return run(args)


def seed(redis, waiting: int) -> None:
    from apps.fleet.host_usage import ledger_keys

    running_key, waiting_key, listed_key = ledger_keys(HOST)
    now_ms = int(time.time() * 1000)
    pipe = redis.pipeline(transaction=False)
    for i in range(8):
        pipe.hset(running_key, f"{HOST}#run-{i}", f"512 100 p{i % 10}")
        pipe.hset(f"rq:job:run-{i}", "status", "started")
    for i in range(waiting):
        # Fresh waiters (asked within the verify age), as a line of deferred jobs re-asking every 9 s is.
        pipe.hset(waiting_key, f"wait-{i}", f"{256 * (1 + i % 4)} 100 p{i % 10} {1 + i % 3} {now_ms - i} {now_ms} 0")
        pipe.hset(f"rq:job:wait-{i}", "status", "scheduled")
    pipe.set(listed_key, "1")
    pipe.execute()


def run(args) -> int:
    import django

    django.setup()
    from apps.fleet.connection import get_redis
    from apps.fleet.host_usage import ledger_keys
    from apps.worker.gates import host_budget

    redis = get_redis()
    seed(redis, args.waiting)
    budget = host_budget.HostBudget(memory_mib=8 * 512, cpu_centi=None)

    def decide(job_id: str, memory: int):
        return lambda: host_budget.decide(redis, HOST, job_id=job_id, holder=f"{HOST}#{job_id}",
                                          size=host_budget.JobSize(memory, 100), project="p3", min_jobs=1,
                                          budget=budget, share_percent=50)

    waits = decide("wait-50", 512)
    assert not waits().admitted
    measured = percentiles(waits, args.repeat)
    baseline = percentiles(lambda: redis.hgetall(ledger_keys(HOST)[1]), args.repeat)
    ok = measured[1] < TARGET_MS
    print(f"host budget decision, {args.waiting} waiting, 8 running (waits)")
    print(f"  decide                      p50 {measured[0]:6.3f} ms  p99 {measured[1]:6.3f} ms")
    print(f"  baseline: HGETALL of the line p50 {baseline[0]:6.3f} ms  p99 {baseline[1]:6.3f} ms")
    print(f"  ratio (p99) {measured[1] / baseline[1]:5.2f}x   target p99 < {TARGET_MS} ms: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
