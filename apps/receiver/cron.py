"""Cron triggers become jobs: the schedule producer that runs on every worker host (`manage.py run_cron`).

Each enabled cron trigger whose folder exists on this host fires on its pattern (5 fields, or 6 with
seconds first, as the ancestor's cron-parser reads them) in PI_CRON_TZ, onto this host's queue. Triggers
are re-read on every tick, so an edit in the admin applies without a restart.

- Job id `cron-<trigger id>-<unix seconds of the occurrence>`: hosts holding the same folder race for one
  id and exactly one job exists.
- No backfill: after downtime only the latest missed occurrence fires, once. A new or re-enabled trigger
  waits for its next occurrence. A Redis that lost `last` gets it from the database's record of the trigger's jobs
  (recorded_last): the occurrence it had handled is not fired again, the next one is not skipped.
- At most one pending occurrence: while the previous job has not started, a new occurrence is skipped.

Redis keys (per trigger):
    pidispatch:cron:last:<trigger id>      unix seconds of the last occurrence handled (fired or skipped)
    pidispatch:cron:pending:<trigger id>   job id of the last occurrence enqueued
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter
from django.conf import settings
from redis.exceptions import RedisError
from rq.job import Job, JobStatus

from apps.fleet.hosts import HostIdentity
from apps.fleet.routing import host_affine_queue
from apps.worker.jobs import JobSpec, enqueue

from . import run_keys
from .models import Trigger, TriggerType

logger = logging.getLogger("pidispatch.cron")

PREFIX = "pidispatch:cron"
NOT_STARTED = {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED}
KEY_TTL_SECONDS = 400 * 86400  # longer than any yearly schedule


@dataclass(frozen=True)
class TickResult:
    fired: list[str]
    skipped: list[str]


def _latest_occurrence(pattern: str, now: datetime) -> datetime:
    seconds_first = len(pattern.split()) == 6
    return croniter(pattern, now.astimezone(ZoneInfo(settings.PI_CRON_TZ)),
                    second_at_beginning=seconds_first).get_prev(datetime)


def _pending(redis, job_id: str | None) -> bool:
    if not job_id:
        return False
    try:
        return Job.fetch(job_id, connection=redis).get_status(refresh=False) in NOT_STARTED
    except Exception:  # gone: finished and expired, or removed
        return False


def recorded_last(trigger: Trigger) -> int:
    """The last occurrence of the trigger the database knows of (its accepted jobs and its runs, by their ids
    `cron-<trigger id>-<unix seconds>`), -1 for none: after a Redis that lost its data, an occurrence is neither
    fired twice nor skipped."""
    from apps.worker.models import AcceptedJob, Run

    prefix = f"cron-{trigger.pk}-"
    found = [AcceptedJob.objects.filter(job_id__startswith=prefix).order_by("-job_id").values_list(
                 "job_id", flat=True).first(),
             Run.objects.filter(trigger_id=trigger.pk, job_id__startswith=prefix).order_by("-started_at").values_list(
                 "job_id", flat=True).first()]
    stamps = [int(job_id.removeprefix(prefix)) for job_id in found if job_id and job_id.removeprefix(prefix).isdigit()]
    return max(stamps, default=-1)


def cron_job_spec(trigger: Trigger, occurrence: datetime, *, job_id: str = "") -> JobSpec:
    """The job of one occurrence (`job_id` names a run started by hand: apps/worker/manual_runs.py)."""
    stamp = int(occurrence.timestamp())
    return JobSpec(
        **run_keys.job_fields(trigger),  # a cron trigger's session (run.resume) is its own (apps/worker/sessions/)
        job_id=job_id or f"cron-{trigger.pk}-{stamp}",
        target_type="local",
        trigger_id=trigger.pk,
        trigger_type=trigger.on_type,
        context={"event": "cron", "cronId": trigger.cron_id, "pattern": trigger.cron_pattern,
                 "scheduledFor": occurrence.isoformat(),
                 "matched": {"index": trigger.position, "type": TriggerType.CRON}},
    )


# Claim an occurrence: the previous `last` for the one caller that moves `last` forward to it, -1 for
# everyone else. Without `last` in Redis (ARGV[3] empty) it answers -2: the caller reads the last occurrence the
# database recorded (recorded_last) and claims again with it. Nothing recorded (-1: a trigger seen for the first
# time) only remembers its latest occurrence (nothing fires for the past).
_CLAIM = """
local last = tonumber(redis.call('GET', KEYS[1]))
if last == nil then
  if ARGV[3] == '' then return -2 end
  last = tonumber(ARGV[3])
  if last < 0 then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return -1 end
  redis.call('SET', KEYS[1], last, 'EX', ARGV[2])
end
if tonumber(ARGV[1]) <= last then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return last
"""
# Give a claimed occurrence back (its enqueue failed), unless another tick has moved on since.
_UNCLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) end
return 0
"""


def tick(redis, host: HostIdentity, now: datetime) -> TickResult:
    """Fire every cron trigger of this host whose latest occurrence has not been handled yet."""
    queue = host_affine_queue(host)
    fired, skipped = [], []
    for trigger in Trigger.objects.filter(enabled=True, on_type=TriggerType.CRON).order_by("position", "id"):
        if not os.path.isdir(trigger.folder):
            continue  # another host holds this folder
        occurrence = _latest_occurrence(trigger.cron_pattern, now)
        stamp = int(occurrence.timestamp())
        last_key = f"{PREFIX}:last:{trigger.pk}"
        previous_last = redis.eval(_CLAIM, 1, last_key, stamp, KEY_TTL_SECONDS, "")
        if previous_last == -2:  # Redis lost it (or never had it): the record says which occurrence was last
            previous_last = redis.eval(_CLAIM, 1, last_key, stamp, KEY_TTL_SECONDS, recorded_last(trigger))
        if previous_last == -1:
            continue
        pending_key = f"{PREFIX}:pending:{trigger.pk}"
        previous = redis.get(pending_key)
        if _pending(redis, previous.decode() if previous else None):
            skipped.append(trigger.cron_id)
            logger.info("cron_skipped_pending trigger=%s occurrence=%s", trigger.pk, stamp)
            continue
        spec = cron_job_spec(trigger, occurrence)
        try:
            created = enqueue(spec, queue).created
        except RedisError:
            # Not lost: the next tick tries this occurrence again (the job id keeps it to one job).
            redis.eval(_UNCLAIM, 1, last_key, stamp, previous_last, KEY_TTL_SECONDS)
            raise
        if created:
            redis.set(pending_key, spec.job_id, ex=KEY_TTL_SECONDS)
            fired.append(spec.job_id)
            logger.info("cron_fired trigger=%s job=%s queue=%s", trigger.pk, spec.job_id, queue)
    return TickResult(fired, skipped)
