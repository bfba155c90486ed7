"""Concurrency slots that hold across every worker process and host sharing one Redis.

A ceiling of N is N independent keys `pidispatch:lease:<name>:<i>` (SET NX PX), each holding
`<host>#<job id>`. Release deletes a key only if it still holds our value. A slot whose holder is no
longer running (its worker was killed) is taken over at once rather than waiting for the TTL, so a crash
frees the slot on the next attempt; the TTL (job timeout + 5 minutes) is the last resort.

Names: `s:<hash16 of a scoped limit's scope>` (fleet-wide `concurrent`), `f:<host>:<hash16 of a folder>`
(one local job per folder per host).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from rq.job import Job, JobStatus

PREFIX = "pidispatch:lease"

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1
end
return 0
"""


@dataclass(frozen=True)
class Lease:
    key: str
    holder: str


def holder_id(host: str, job_id: str) -> str:
    return f"{host}#{job_id}"


def _holder_is_running(redis, holder: str) -> bool:
    job_id = holder.partition("#")[2]
    try:
        status = Job.fetch(job_id, connection=redis).get_status(refresh=False)
    except Exception:  # no such job (expired, removed): nobody runs it
        return False
    return status == JobStatus.STARTED


def acquire(redis, name: str, slots: int, holder: str, ttl_seconds: int) -> Lease | None:
    """One free slot of `name`, or None when all `slots` are held by running jobs."""
    job_id = holder.partition("#")[2]
    start = zlib.crc32(job_id.encode()) % slots  # spread racers over the slots
    ttl_ms = ttl_seconds * 1000
    for offset in range(slots):
        key = f"{PREFIX}:{name}:{(start + offset) % slots}"
        if redis.set(key, holder, nx=True, px=ttl_ms):
            return Lease(key, holder)
        current = redis.get(key)
        if current is None:
            if redis.set(key, holder, nx=True, px=ttl_ms):
                return Lease(key, holder)
            continue
        current = current.decode()
        if current == holder:  # our own slot from an earlier pickup of this very job
            redis.pexpire(key, ttl_ms)
            return Lease(key, holder)
        if not _holder_is_running(redis, current) and redis.eval(_TAKE_OVER, 1, key, current, holder, ttl_ms):
            return Lease(key, holder)
    return None


def release(redis, lease: Lease) -> None:
    redis.eval(_RELEASE, 1, lease.key, lease.holder)
