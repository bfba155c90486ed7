"""Cancel a job by id, in any state, on any host (DESIGN section 4).

- queued, deferred, held or waiting out a retry: removed from its queue or the scheduled registry, with
  its payload; it never runs and leaves no run record;
- running: a cancel request is written, and the worker process that runs it (on whichever host) sees it
  within about a second, acknowledges it and stops the job's container (SIGTERM, SIGKILL after 5 s) from
  its main process; the work horse records the run `operator-cancel`. When no worker acknowledges within
  PI_FLEET_CANCEL_ACK_SECONDS (its host is cut off, or its worker is between a death and a restart) the request
  stays, `pending`: the job's worker carries it out when it reaches Redis again, and a worker that lost the job
  records it `operator-cancel` too (apps/worker/process/worker_lost.py). Withdrawing it instead would let a
  job an operator meant to stop run on after a network partition heals;
- finished or failed: nothing to do, and the answer says so.

The request also stays for the job's later life: the gate ladder's first gate asks `is_cancel_requested`
and refuses a job that slipped past removal (`operator-cancel`, no container), and the worker class
never retries a cancelled job.

Each request is also a row of the record (CancelRequest, as long as the key lives), from which state.py writes it
again into a Redis that lost its data.

Redis keys:
    pidispatch:cancel:<job id>   HASH by, at (ISO), state (requested | acknowledged | removed), worker
                                 (the RQ worker that acknowledged); expires after PI_FLEET_CANCEL_TTL_SECONDS
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry

from . import audit, registry, state, waiting
from .connection import get_redis, text

logger = logging.getLogger("pidispatch.fleet")

REQUESTED, ACKNOWLEDGED, REMOVED = "requested", "acknowledged", "removed"
JOB_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ACKNOWLEDGE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'requested' then
    redis.call('HSET', KEYS[1], 'state', 'acknowledged', 'worker', ARGV[1])
    return 1
end
if state == 'acknowledged' and redis.call('HGET', KEYS[1], 'worker') == ARGV[1] then return 1 end
return 0
"""
_WITHDRAW = """
if redis.call('HGET', KEYS[1], 'state') == 'requested' then redis.call('DEL', KEYS[1]) return 1 end
return 0
"""


def is_job_id(job_id) -> bool:
    return isinstance(job_id, str) and bool(job_id) and len(job_id) <= 200 and set(job_id) <= JOB_ID_CHARS


def request_key(job_id: str) -> str:
    return f"pidispatch:cancel:{job_id}"


def write_request(pipe, job_id: str, *, by: str, at, seconds: int, keep: bool = False) -> None:
    """The cancel request's key (queued on `pipe`), living `seconds`. `keep`: one Redis holds already is left as it
    is (its state: acknowledged, removed)."""
    key = request_key(job_id)
    if keep:
        pipe.hsetnx(key, "by", by)
        pipe.hsetnx(key, "at", at.isoformat())
        pipe.hsetnx(key, "state", REQUESTED)
    else:
        pipe.hset(key, mapping={"by": by, "at": at.isoformat(), "state": REQUESTED})
    pipe.expire(key, seconds)


def is_cancel_requested(job_id: str, redis=None) -> bool:
    """True once an operator asked to cancel this job (and the request was not withdrawn)."""
    return bool((redis or get_redis()).exists(request_key(job_id)))


def acknowledge(redis, job_id: str, worker_name: str) -> bool:
    """The worker running the job takes the cancel on; true when it is this worker's to carry out."""
    return bool(redis.eval(_ACKNOWLEDGE, 1, request_key(job_id), worker_name))


@dataclass(frozen=True)
class CancelResult:
    job_id: str
    outcome: str  # removed | stopping | pending | ended | not-found
    message: str
    audit_error: str = ""

    @property
    def changed(self) -> bool:
        return self.outcome in ("removed", "stopping", "pending")



def cancel_job(redis, job_id: str, *, by: str, ack_seconds: float | None = None) -> CancelResult:
    if not is_job_id(job_id):
        raise ValueError(f"{job_id!r} is not a job id (letters, digits, '_' and '-')")
    try:
        job = Job.fetch(job_id, connection=redis)
    except NoSuchJobError:
        return CancelResult(job_id, "not-found", f"no job {job_id} in Redis: it never existed, or it ended and "
                                                 "expired (see the run history); nothing was changed")
    key = request_key(job_id)
    now = timezone.now()
    pipe = redis.pipeline()
    write_request(pipe, job_id, by=by, at=now, seconds=settings.PI_FLEET_CANCEL_TTL_SECONDS)
    pipe.execute()

    result = None
    for _ in range(20):  # a job may move between states while we look (promoted, popped); look again
        status = job.get_status(refresh=True)
        if status == JobStatus.QUEUED and redis.lrem(Queue(job.origin, connection=redis).key, 0, job_id):
            result = _removed(redis, job, "queued")
        elif (status == JobStatus.SCHEDULED
              and redis.zrem(ScheduledJobRegistry(job.origin, connection=redis).key, job_id)):
            result = _removed(redis, job, "deferred")
        elif status == JobStatus.DEFERRED and redis.zrem(DeferredJobRegistry(job.origin, connection=redis).key, job_id):
            result = _removed(redis, job, "waiting on a dependency")
        elif status == JobStatus.STARTED:
            result = _await_acknowledgement(redis, job, ack_seconds)
        elif status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
            redis.eval(_WITHDRAW, 1, key)
            result = CancelResult(job_id, "ended", f"job {job_id} already ended ({status.value}); nothing was changed")
        if result:
            break
        time.sleep(0.1)
    else:  # popped by a worker that has not marked it started yet: that worker must acknowledge it
        result = _await_acknowledgement(redis, job, ack_seconds)
    logger.info("fleet_cancel job=%s outcome=%s", job_id, result.outcome)
    if result.changed:
        unrecorded = state.record_cancel(job_id, by=by, at=now, seconds=settings.PI_FLEET_CANCEL_TTL_SECONDS)
        error = audit.record("cancel", actor=by, queues=[job.origin], job_id=job_id,
                             outcome=result.message + (f" [{unrecorded}]" if unrecorded else ""))
        return CancelResult(result.job_id, result.outcome, result.message,
                            "; ".join(said for said in (unrecorded, error) if said))
    return result


def _removed(redis, job: Job, state: str) -> CancelResult:
    from apps.worker import accepted

    redis.hset(request_key(job.id), "state", REMOVED)
    waiting.forget(redis, job.id)
    accepted.settle(job.id)  # before its copy goes: a reconciler finding it gone must not queue it again
    job.delete(remove_from_queue=False)  # its payload holds issue text: nothing of it is kept
    return CancelResult(job.id, "removed", f"removed {state} job {job.id} from {job.origin}: it will not run "
                                           "and leaves no run record")


def _await_acknowledgement(redis, job: Job, ack_seconds: float | None) -> CancelResult:
    key = request_key(job.id)
    wait = settings.PI_FLEET_CANCEL_ACK_SECONDS if ack_seconds is None else ack_seconds
    deadline = time.monotonic() + wait
    while True:
        state, worker = (text(v) for v in redis.hmget(key, "state", "worker"))
        if state == ACKNOWLEDGED:
            return CancelResult(job.id, "stopping", f"cancel of running job {job.id} acknowledged by "
                                                    f"{_where(redis, worker)}: its container is being stopped "
                                                    "(SIGTERM, SIGKILL after 5 s) and the run recorded operator-cancel")
        status = job.get_status(refresh=True)
        if status in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED):
            if not redis.eval(_WITHDRAW, 1, key):
                continue  # acknowledged at the last moment: report that
            return CancelResult(job.id, "ended", f"job {job.id} ended ({status.value}) before it could be "
                                                 "cancelled; nothing was changed")
        if time.monotonic() >= deadline:
            return CancelResult(job.id, "pending", f"no worker acknowledged the cancel of running job {job.id} within "
                                                   f"{wait:g} s (its host may be unreachable): the request stays, and "
                                                   "its worker stops the job when it reaches Redis again")
        time.sleep(0.2)


def _where(redis, worker_name: str) -> str:
    process = registry.read_process(redis, worker_name) if worker_name else None
    return f"the worker on host {process.host}" if process else "its worker"
