"""Concurrency slots that hold across every worker process and host sharing one Redis.

A ceiling of N is N independent keys `pidispatch:lease:<name>:<i>`, each holding `<host>#<job id>`; one
script counts the held slots and takes a free one, so no two racers can both take the last. Release
deletes a key only if it still holds our value. A slot whose holder is no longer running (its worker was
killed) is taken over at once rather than waiting for the TTL, so a crash frees the slot on the next
attempt; the TTL is the last resort. A holder is a host's attempt at a job: once a lost attempt's job runs
again on another host, the old host's slots are no longer held by anyone running.

A ceiling can be lowered while its slots are held (the live PI_CONCURRENCY, a scoped limit edited in the
admin): `pidispatch:lease:<name>:span` remembers the highest ceiling whose slots may still be held, and
those count against the lower one until their jobs end, so the new ceiling holds from the next start on.

Names: `h:<host>` (PI_CONCURRENCY, apps/worker/gates/host_slots.py), `s:<hash16 of a scoped limit's scope>`
(a repository's fleet-wide `concurrent`), `f:<host>:<hash16 of a folder>` (one local job per folder per host),
`wc:<host>` and `wc` (wait checks, apps/worker/gates/wait_slots.py).
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

from redis.exceptions import RedisError
from rq.job import Job, JobStatus

from apps.fleet import registry

PREFIX = "pidispatch:lease"
SPAN_GREW = -2

logger = logging.getLogger("pidispatch.leases")

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1] the span, KEYS[2..] every slot below it; ARGV holder, ttl ms, ceiling, the index to try first.
# Returns the slot's index, -1 when held slots fill the ceiling, SPAN_GREW when a higher ceiling came
# meanwhile (the caller reads the span again).
_TAKE = """
local holder, ttl, ceiling, start = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if tonumber(redis.call('GET', KEYS[1]) or '0') > #KEYS - 1 then return -2 end
local held, top = 0, 0
for i = 2, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value == holder then
    redis.call('PEXPIRE', KEYS[i], ttl)
    redis.call('PEXPIRE', KEYS[1], ttl)
    return i - 2
  end
  if value then held, top = held + 1, i - 1 end
end
if held >= ceiling then return -1 end
for offset = 0, ceiling - 1 do
  local index = (start + offset) % ceiling
  if redis.call('SET', KEYS[index + 2], holder, 'NX', 'PX', ttl) then
    redis.call('SET', KEYS[1], math.max(ceiling, top), 'PX', ttl)
    return index
  end
end
return -1
"""


@dataclass(frozen=True)
class Lease:
    key: str
    holder: str


def holder_id(host: str, job_id: str) -> str:
    return f"{host}#{job_id}"


def _holder_is_running(redis, holder: str) -> bool:
    host, _, job_id = holder.partition("#")
    try:
        job = Job.fetch(job_id, connection=redis)
    except Exception:  # no such job (expired, removed): nobody runs it
        return False
    if job.get_status(refresh=False) != JobStatus.STARTED:
        return False
    process = registry.read_process(redis, job.worker_name) if job.worker_name else None
    return process is None or process.host == host  # no entry: it cannot be told, so it counts as running


def _clear_gone_holders(redis, keys: list[str]) -> bool:
    """Free the slots whose holder no longer runs; True when any was freed."""
    freed = False
    for key, value in zip(keys, redis.mget(keys), strict=True):
        if value is not None and not _holder_is_running(redis, value.decode()):
            freed |= bool(redis.eval(_RELEASE, 1, key, value))
    return freed


def acquire(redis, name: str, slots: int, holder: str, ttl_seconds: float) -> Lease | None:
    """One free slot of `name` (or the one this holder already has), or None when `slots` running jobs
    hold slots of it, counting those above `slots` left from a higher ceiling."""
    job_id = holder.partition("#")[2]
    start = zlib.crc32(job_id.encode()) % slots  # spread racers over the slots
    span_key = f"{PREFIX}:{name}:span"
    cleared = False
    for _ in range(4):
        span = max(slots, int(redis.get(span_key) or 0))
        keys = [f"{PREFIX}:{name}:{i}" for i in range(span)]
        index = redis.eval(_TAKE, 1 + span, span_key, *keys, holder, int(ttl_seconds * 1000), slots, start)
        if index >= 0:
            return Lease(keys[index], holder)
        if index == SPAN_GREW:
            continue
        if cleared or not _clear_gone_holders(redis, keys):
            return None
        cleared = True
    return None


def release(redis, lease: Lease) -> None:
    redis.eval(_RELEASE, 1, lease.key, lease.holder)


def release_all(redis, held: list[Lease], job_id: str) -> None:
    """Give back what one job holds, last taken first. A Redis fault is logged: the TTLs free the rest."""
    for lease in reversed(held):
        try:
            release(redis, lease)
        except RedisError:
            logger.warning("lease_release_failed job=%s", job_id)
    held.clear()
