"""The budget windows rebuilt from the run records when Redis lost them, before any job is admitted.

budget.py keeps the job-count, token and dollar windows as Redis counters. A Redis that came back empty, or from an
older copy of its data, would count them from zero (or from an older value) again: a cap an operator set could be
passed by a failure nobody caused. So before a job is admitted (the ladder asks before its first budget gate),
`ensure_rebuilt` compares the Redis process's run id with `pidispatch:budget:rebuilt`; on a mismatch one process
rebuilds (a lock; the others' jobs come back in a moment, `budget-rebuilding`) from:

- the run records of the current day, week and month: each counts in the ledgers it recorded (`Run.ledgers`: the
  job-count windows it took a slot in, the dollar windows its hold was charged in, at what it was charged), a run
  recorded before ledgers were kept in the deployment's windows (its slot when it reserved one, its charge);
- the day's tokens, from the records' tokens;
- each attempt in flight (it took its budget and is not recorded yet: AcceptedJob.spending_since): one slot in every
  job-count window it answers to and its per-job dollar cap held in every dollar window it may spend in (every model
  row: which models it calls is not known here), its hold written again for it to settle. An attempt still in its
  gates is not counted: it reserves for itself after the rebuild.

A counter is only ever raised (to the larger of what Redis holds and what the record says): the worst case is a job
refused that would have fit, never a cap passed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Count, Sum
from django.utils import timezone

from apps.fleet.connection import unmarked_run_id

from . import budget, money

logger = logging.getLogger("pidispatch.budget")

REBUILT = f"{budget.PREFIX}:rebuilt"  # the run id of the Redis process the windows were last rebuilt into
LOCK = f"{budget.PREFIX}:rebuilding"
LOCK_SECONDS = 60


class Rebuilding(Exception):
    """Another process is rebuilding the windows now: no job is admitted until it is done."""


# KEYS: the marker, then the job-count keys, then the token key, then the dollar keys, then the holds.
# ARGV: the run id, the numbers of each kind of key, then per count key its value and TTL; the token value and TTL;
# per dollar key used, held and TTL; per hold its amount, window keys and TTL.
_RAISE = """
local counts, dollars, holds = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local k, a = 2, 5
for i = 1, counts do
  if tonumber(redis.call('GET', KEYS[k]) or '0') < tonumber(ARGV[a]) then
    redis.call('SET', KEYS[k], ARGV[a], 'EX', ARGV[a + 1])
  end
  k, a = k + 1, a + 2
end
if tonumber(redis.call('GET', KEYS[k]) or '0') < tonumber(ARGV[a]) then
  redis.call('SET', KEYS[k], ARGV[a], 'EX', ARGV[a + 1])
end
k, a = k + 1, a + 2
for i = 1, dollars do
  local now = redis.call('HMGET', KEYS[k], 'used', 'held')
  if tonumber(now[1] or '0') < tonumber(ARGV[a]) then redis.call('HSET', KEYS[k], 'used', ARGV[a]) end
  if tonumber(now[2] or '0') < tonumber(ARGV[a + 1]) then redis.call('HSET', KEYS[k], 'held', ARGV[a + 1]) end
  redis.call('EXPIRE', KEYS[k], ARGV[a + 2], 'NX')
  k, a = k + 1, a + 3
end
for i = 1, holds do
  if redis.call('EXISTS', KEYS[k]) == 0 then
    redis.call('HSET', KEYS[k], 'amount', ARGV[a], 'keys', ARGV[a + 1])
    redis.call('EXPIRE', KEYS[k], ARGV[a + 2])
  end
  k, a = k + 1, a + 3
end
redis.call('SET', KEYS[1], ARGV[1])
return 0
"""


def ensure_rebuilt(redis, now: datetime | None = None) -> bool:
    """Rebuild the windows unless they were rebuilt into this very Redis process. Whether it rebuilt now. Raises
    Rebuilding while another process does it; DatabaseError and RedisError as they come (the job waits)."""
    run_id = unmarked_run_id(redis, REBUILT)
    if run_id is None:
        return False
    if not redis.set(LOCK, run_id or "-", nx=True, ex=LOCK_SECONDS):
        raise Rebuilding
    try:
        rebuild(redis, now or timezone.now(), run_id)
    finally:
        redis.delete(LOCK)
    return True


def window_starts(now: datetime) -> dict[str, datetime]:
    """Where the current day, week (from Monday) and month began (UTC), as budget.window_keys names them."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return {budget.DAY: day, budget.WEEK: day - timedelta(days=day.weekday()), budget.MONTH: day.replace(day=1)}


def rebuild(redis, now: datetime, run_id: str) -> None:
    counts: dict[str, int] = defaultdict(int)
    used: dict[str, int] = defaultdict(int)
    held: dict[str, int] = defaultdict(int)
    starts = window_starts(now)
    _recorded(now, starts, counts, used)
    holds = _in_flight(now, counts, held)
    tokens = _tokens_since(starts[budget.DAY])

    keys, args = [REBUILT], [run_id, len(counts), len(set(used) | set(held)), len(holds)]
    for key, value in counts.items():
        keys.append(key)
        args += [value, budget.TTL_SECONDS[_window_of(key)]]
    keys.append(budget.tokens_key(now))
    args += [tokens, budget.TTL_SECONDS[budget.DAY]]
    for key in sorted(set(used) | set(held)):
        keys.append(key)
        args += [used.get(key, 0), held.get(key, 0), budget.TTL_SECONDS[_window_of(key)]]
    for job_id, (amount, window_keys) in holds.items():
        keys.append(budget.hold_key(job_id))
        args += [amount, " ".join(window_keys), budget.HOLD_TTL_SECONDS]
    budget._script(redis, _RAISE)(keys=keys, args=args)
    logger.warning("budget_rebuilt redis_run=%s windows=%d dollar_windows=%d in_flight=%d tokens=%d", run_id[:12],
                   len(counts), len(set(used) | set(held)), len(holds), tokens)


def _window_of(key: str) -> str:
    return {"d": budget.DAY, "w": budget.WEEK, "m": budget.MONTH}[key.rsplit(":", 2)[-2]]


def _recorded(now: datetime, starts: dict[str, datetime], counts: dict, used: dict) -> None:
    """What the run records of each window counted: one aggregate per window, grouped by where the runs counted."""
    from apps.worker.models import Run

    for window, start in starts.items():
        groups = (Run.objects.filter(started_at__gte=start).order_by()
                  .values("ledgers", "budget_reserved")
                  .annotate(runs=Count("id"), charged=Sum("dollars_charged"), held=Count("dollars_reserved")))
        for group in groups:
            ledgers = group["ledgers"] or {"jobs": ["all"] if group["budget_reserved"] else [],
                                           "usd": ["all"] if group["held"] else []}
            for ledger in ledgers.get("jobs", []):
                counts[budget.window_keys(ledger, now)[window]] += group["runs"]
            charged = money.cost_micros(group["charged"]) if group["charged"] else 0
            for ledger in ledgers.get("usd", []):
                used[budget.usd_window_keys(ledger, now)[window]] += charged


def _in_flight(now: datetime, counts: dict, held: dict) -> dict[str, tuple[int, list[str]]]:
    """Each attempt that took its budget and is not recorded yet counts as if it had reserved everything it might:
    its holds."""
    from apps.worker.jobs import JobSpec, JobSpecError
    from apps.worker.models import AcceptedJob, Run

    from . import runtime_settings

    started = list(AcceptedJob.objects.filter(settled_at__isnull=True, spending_since__isnull=False)
                   .values_list("job_id", "started_attempt", "payload"))
    recorded = set(Run.objects.filter(job_id__in=[job_id for job_id, _, _ in started])
                   .values_list("job_id", "attempt"))
    try:
        runtime = runtime_settings.current()
    except runtime_settings.SettingsInvalid:
        runtime = runtime_settings.from_environment()
    holds = {}
    for job_id, attempt, payload in started:
        if (job_id, attempt) in recorded:
            continue
        try:
            spec = JobSpec.from_payload(payload or {})
        except JobSpecError:
            continue
        rows = budget.rows_for(spec)
        for limit in (rows.scope, rows.project):
            if limit is not None:
                for key in budget.window_keys(f"s:{budget.scope_hash(limit.scope)}", now).values():
                    counts[key] += 1
        for key in budget.window_keys("all", now).values():
            counts[key] += 1
        try:
            cap = budget.job_cost_cap(spec, runtime)
        except budget.DollarRefusal:
            continue
        windows = budget.applicable_dollar_windows(rows, runtime, now)
        if cap is None or not windows:
            continue
        for window in windows:
            held[window.key] += cap
        holds[job_id] = (cap, [window.key for window in windows])
    return holds


def _tokens_since(start: datetime) -> int:
    from apps.worker.models import Run

    return int(Run.objects.filter(started_at__gte=start).aggregate(n=Sum("tokens_total"))["n"] or 0)
