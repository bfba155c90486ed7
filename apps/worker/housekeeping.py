"""Housekeeping: the rows pidispatch no longer needs, deleted in short batches, once a UTC day across the fleet.

One home, `housekeep()`, called by `manage.py housekeeping` (an operator, any time) and by the workers' daily duty
(apps/worker/process/worker_housekeeping.py, which runs `manage.py housekeeping --daily` beside the worker).

What goes (`rules()`, each a queryset asking its model's own question):
- run records that started before the UTC day PI_RUN_RETENTION_DAYS (365) back, with their kept logs. Each batch
  is announced inside its transaction (`runs_pruning`), so /metrics goes on counting it (apps/insight: PrunedRuns)
  and the cost page's kept partials of its days are dropped (a bulk delete sends no per-row signal);
- settled deliveries (queued, duplicate, ignored, rejected, discarded) received more than PI_DELIVERY_RETENTION_DAYS
  (30) ago: never one still in hand or pending, whatever its age;
- the fleet's audit rows (FleetAction) older than a year;
- expired sessions;
- revoked and expired API tokens.

How: per rule, batches of `batch` rows (1000) walked along an index from the oldest, each in a transaction of its
own that locks its own rows only (`SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL, so a second pruner skips
them instead of waiting; SQLite's write lock for the batch's milliseconds), then deletes them by primary key and
commits, with a pause between batches (on SQLite by default, SQLITE_PAUSE, so waiting writers get their turn).
Never one DELETE over a whole table's past: a run's record write waits for one batch at most (bench/housekeeping.py
measures it). A crash loses the batch in flight only; the next run deletes it.

Once a day across the fleet, with Redis:
    pidispatch:housekeeping:lock              STRING JSON {holder `<host>#<pid>`, how, since} while a run goes on
                                              (SET NX, LOCK_SECONDS, renewed at every batch): one run at a time,
                                              the command's included
    pidispatch:housekeeping:day:<YYYY-MM-DD>  STRING JSON {state: done|failed, at, ...}: the UTC day's run is done
                                              (kept DAY_SECONDS) or failed (RETRY_SECONDS, then a worker tries again)
    pidispatch:housekeeping:last              STRING JSON of the last complete run: at, took_seconds, by, how,
                                              deleted (no TTL; what `doctor` and the command read)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import import_module

from django.conf import settings
from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone
from redis.exceptions import RedisError

logger = logging.getLogger("pidispatch.housekeeping")

PREFIX = "pidispatch:housekeeping"
LOCK_KEY = f"{PREFIX}:lock"
LAST_KEY = f"{PREFIX}:last"
LOCK_SECONDS = 300  # past the last batch's renewal: a run killed mid-way holds the lock this long at most
DAY_SECONDS = 2 * 86400
RETRY_SECONDS = 3600  # a failed daily run is tried again by a worker after this
BATCH = 1000
# Between batches on SQLite, whose write lock is the whole database's: a writer waiting for it (a run's record, the
# inbox) sleeps in SQLite's busy handler up to 100 ms at a time, and must find the lock free when it wakes, not
# taken again by the next batch. On PostgreSQL a batch locks its own rows only: no pause.
SQLITE_PAUSE = 0.1
FLEET_ACTION_DAYS = 365
ACCEPTED_JOB_DAYS = timedelta(days=1)
STALE_AFTER = timedelta(days=2)  # doctor warns when the last complete run is older

# Sent inside the transaction that deletes a batch of run records, before the delete: `runs` is the batch (a
# queryset). apps/insight keeps its numbers true with it.
runs_pruning = Signal()

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class HousekeepingError(Exception):
    """Housekeeping could not run or stopped; `report` says what was deleted before it stopped."""

    def __init__(self, message: str, report: Report | None = None):
        super().__init__(message)
        self.report = report


class Busy(HousekeepingError):
    """Another run holds the lock."""


@dataclass(frozen=True)
class Rule:
    name: str  # "runs", "deliveries", ...
    what: str  # what goes, in words, with its cutoff
    queryset: object  # the rows that go
    order: str  # an indexed column to walk them along, oldest first
    delete: Callable[[list], None]  # deletes the batch's primary keys


@dataclass
class Report:
    how: str
    by: str
    started_at: datetime
    ended_at: datetime | None = None
    deleted: dict[str, int] = field(default_factory=dict)

    @property
    def took_seconds(self) -> float:
        return ((self.ended_at or timezone.now()) - self.started_at).total_seconds()

    def as_record(self) -> dict:
        return {"at": (self.ended_at or timezone.now()).isoformat(), "started_at": self.started_at.isoformat(),
                "took_seconds": round(self.took_seconds, 3), "by": self.by, "how": self.how, "deleted": self.deleted}


def _utc_midnight(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def run_cutoff(now: datetime) -> datetime:
    """Runs that started before this go: the start of the UTC day PI_RUN_RETENTION_DAYS back, so a day's runs go
    together (the cost page and /metrics count per UTC day)."""
    return _utc_midnight(now) - timedelta(days=settings.PI_RUN_RETENTION_DAYS)


def _delete_runs(ids: list) -> None:
    from apps.worker.models import Run, RunChanges, RunLog

    runs = Run.objects.filter(pk__in=ids)
    runs_pruning.send(sender=Run, runs=runs)
    RunLog.objects.filter(run_id__in=ids).delete()
    RunChanges.objects.filter(run_id__in=ids).delete()
    # Django's own fast path: delete() would load every row to send each its post_delete signal (one Redis round
    # trip per run for the cost page), which runs_pruning above stands in for, once per batch.
    runs._raw_delete(runs.db)


def _deleting(model) -> Callable[[list], None]:
    def delete(ids: list) -> None:
        model.objects.filter(pk__in=ids).delete()  # no signals, no rows pointing at them: one DELETE

    return delete


def _session_model():
    """The session table, when the session engine keeps one (Django's db and cached_db engines)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore
    return store.get_model_class() if hasattr(store, "get_model_class") else None


def rules(now: datetime) -> list[Rule]:
    from apps.access.models import ApiToken
    from apps.fleet.models import FleetAction
    from apps.receiver.models import Delivery
    from apps.worker.models import AcceptedJob, Run

    def day(moment: datetime) -> str:
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")

    runs_before = run_cutoff(now)
    deliveries_before = now - timedelta(days=settings.PI_DELIVERY_RETENTION_DAYS)
    actions_before = now - timedelta(days=FLEET_ACTION_DAYS)
    found = [
        Rule("runs", f"run records started before {day(runs_before)} (PI_RUN_RETENTION_DAYS="
             f"{settings.PI_RUN_RETENTION_DAYS}), with their logs", Run.objects.started_before(runs_before),
             "started_at", _delete_runs),
        Rule("deliveries", f"settled deliveries received before {day(deliveries_before)} (PI_DELIVERY_RETENTION_DAYS="
             f"{settings.PI_DELIVERY_RETENTION_DAYS}; pending ones stay)",
             Delivery.objects.settled_before(deliveries_before), "id", _deleting(Delivery)),
        Rule("fleet actions", f"fleet audit rows from before {day(actions_before)} (a year)",
             FleetAction.objects.before(actions_before), "at", _deleting(FleetAction)),
        # A settled job's row has done its work (only its ids are left); a day of them stays for a look.
        Rule("accepted jobs", f"rows of jobs settled before {day(now - ACCEPTED_JOB_DAYS)} (open ones stay)",
             AcceptedJob.objects.filter(settled_at__lt=now - ACCEPTED_JOB_DAYS), "settled_at",
             _deleting(AcceptedJob)),
    ]
    session = _session_model()
    if session is not None:
        found.append(Rule("sessions", "expired sessions", session.objects.filter(expire_date__lt=now), "expire_date",
                          _deleting(session)))
    found.append(Rule("api tokens", "revoked and expired API tokens", ApiToken.objects.revoked_or_expired(now), "id",
                      _deleting(ApiToken)))
    return found


def plan(now: datetime | None = None) -> list[tuple[Rule, int]]:
    """What a run now would delete (`--dry-run`): each rule with its count. Takes no lock, needs no Redis."""
    return [(rule, rule.queryset.count()) for rule in rules(now or timezone.now())]


# --- the lock, the day, the record ------------------------------------------------------------------------

def day_key(moment: datetime) -> str:
    return f"{PREFIX}:day:{moment.astimezone(UTC).date().isoformat()}"


def due_today(redis, now: datetime | None = None) -> bool:
    """For the workers' duty, in one round trip: today's run is neither done, nor failed lately, nor going on."""
    return redis.exists(day_key(now or timezone.now()), LOCK_KEY) == 0


def _read_json(redis, key: str) -> dict | None:
    value = redis.get(key)
    if not value:
        return None
    try:
        found = json.loads(value)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def last_run(redis) -> dict | None:
    """The last complete run's record (`at`, `took_seconds`, `by`, `how`, `deleted`), or None."""
    return _read_json(redis, LAST_KEY)


def todays(redis, now: datetime | None = None) -> dict | None:
    """Today's (UTC) daily run as it ended: `state` done or failed (`error`), `at`; None before it ends."""
    return _read_json(redis, day_key(now or timezone.now()))


def running(redis) -> dict | None:
    """The run going on now (`holder`, `how`, `since`), or None."""
    return _read_json(redis, LOCK_KEY)


def holder_id() -> str:
    from apps.fleet.hosts import this_host

    return f"{this_host().name}#{os.getpid()}"


class _Lock:
    def __init__(self, redis, how: str):
        self.redis = redis
        self.value = json.dumps({"holder": holder_id(), "how": how, "since": timezone.now().isoformat()})

    def take(self) -> bool:
        return bool(self.redis.set(LOCK_KEY, self.value, nx=True, ex=LOCK_SECONDS))

    def renew(self) -> None:
        if not self.redis.eval(_RENEW, 1, LOCK_KEY, self.value, LOCK_SECONDS):
            raise HousekeepingError(f"lost the lock ({LOCK_KEY}): a batch took longer than {LOCK_SECONDS} s and "
                                    "another run may have started")

    def release(self) -> None:
        self.redis.eval(_RELEASE, 1, LOCK_KEY, self.value)


# --- the run ------------------------------------------------------------------------------------------------

Progress = Callable[[Rule, int, int], None]  # (rule, deleted so far, how many there were at the start)


def housekeep(redis, *, how: str = "command", daily: bool = False, batch: int = BATCH, pause: float | None = None,
              progress: Progress | None = None) -> Report | None:
    """Delete what the rules say, batch by batch, holding the fleet's lock; record the run as the day's and the
    last. `daily` (the workers' duty): None, and nothing done, when today's run is done, failed within the last
    RETRY_SECONDS or going on. Otherwise a run already going on raises Busy. A failure raises HousekeepingError
    with what was deleted before it (that stays deleted); a daily run that failed is tried again after
    RETRY_SECONDS."""
    if batch < 1:
        raise ValueError("the batch size must be at least 1")
    if pause is None:
        pause = SQLITE_PAUSE if connection.vendor == "sqlite" else 0.0
    lock = _Lock(redis, how)
    if not lock.take():
        if daily:
            return None
        going = running(redis) or {}
        raise Busy(f"housekeeping is already running: {going.get('holder', '?')} ({going.get('how', '?')}) since "
                   f"{going.get('since', '?')}; its lock lapses {LOCK_SECONDS} s after its last batch")
    now = timezone.now()
    report = Report(how=how, by=holder_id(), started_at=now)
    try:
        if daily and redis.exists(day_key(now)):
            return None  # another worker's run finished between this one's look and its lock
        logger.info("housekeeping_started how=%s by=%s", how, report.by)
        for rule in rules(now):
            _prune(rule, report, lock, batch, pause, progress)
        report.ended_at = timezone.now()
        record = report.as_record()
        with redis.pipeline() as pipe:
            pipe.set(day_key(now), json.dumps({"state": "done", **record}), ex=DAY_SECONDS)
            pipe.set(LAST_KEY, json.dumps(record))
            pipe.execute()
        logger.info("housekeeping_done how=%s took=%.1fs %s", how, report.took_seconds,
                    " ".join(f"{name.replace(' ', '_')}={n}" for name, n in report.deleted.items()))
        return report
    except Exception as error:
        report.ended_at = timezone.now()
        logger.error("housekeeping_failed how=%s error=%s deleted=%s", how, type(error).__name__,
                     ",".join(f"{name.replace(' ', '_')}:{n}" for name, n in report.deleted.items()) or "none")
        if daily:
            # When Redis itself is what failed, the lock lapses and a worker looks again.
            with contextlib.suppress(RedisError):
                redis.set(day_key(now), json.dumps({"state": "failed", "at": report.ended_at.isoformat(),
                                                    "error": type(error).__name__}), ex=RETRY_SECONDS)
        if isinstance(error, HousekeepingError):
            error.report = report
            raise
        raise HousekeepingError(f"{type(error).__name__}: {error}".strip().rstrip(":"), report) from error
    finally:
        with contextlib.suppress(RedisError):  # it lapses after LOCK_SECONDS
            lock.release()


def _prune(rule: Rule, report: Report, lock: _Lock, batch: int, pause: float, progress: Progress | None) -> None:
    total = rule.queryset.count()
    report.deleted[rule.name] = 0
    if progress:
        progress(rule, 0, total)
    floor = None
    while True:
        lock.renew()
        deleted, floor = _batch(rule, floor, batch)
        if not deleted:
            break
        report.deleted[rule.name] += deleted
        if progress:
            progress(rule, report.deleted[rule.name], total)
        if deleted < batch:
            break
        if pause:
            time.sleep(pause)


def _batch(rule: Rule, floor, size: int):
    """One batch, in a transaction of its own: the oldest `size` rows at or past `floor` along the rule's index
    (everything before it is gone), locked (others' locked rows skipped), deleted, committed."""
    rows = rule.queryset if floor is None else rule.queryset.filter(**{f"{rule.order}__gte": floor})
    with transaction.atomic():
        found = list(rows.select_for_update(skip_locked=True).order_by(rule.order)
                     .values_list("pk", rule.order)[:size])
        if not found:
            return 0, floor
        rule.delete([pk for pk, _ in found])
    return len(found), found[-1][1]
