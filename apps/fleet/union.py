"""The queue union (DESIGN section 4): what "all" means for pause, resume, status and the panel.

    pi-jobs  ∪  host queues of registry rows that declare a name (live or stale)
             ∪  pi-jobs@* queues that exist in Redis (RQ's queue set; every worker adds its own at boot)
             ∪  queues that carry a pause flag

A registry row is a 90 s lease while a queue and its pause flag are permanent, so a dead host's paused
queue stays in the union and can be resumed. If a source cannot be read, the union keeps the queues it
had the last time it was read whole and says the view is degraded; it never shrinks to `pi-jobs`.

Redis keys:
    pidispatch:fleet:last-union   STRING JSON {"at": unix seconds, "queues": [...]}: the last union read whole
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

from redis.exceptions import RedisError
from rq import Queue

from . import pauses, registry
from .connection import text
from .queues import SHARED_QUEUE, host_queue, is_dispatch_queue

LAST_UNION = "pidispatch:fleet:last-union"


@dataclass(frozen=True)
class QueueUnion:
    queues: tuple[str, ...]
    hosts: tuple[registry.HostRow, ...] | None  # None when the registry could not be read
    degraded: str = ""



def existing_queues(redis) -> set[str]:
    """Our queues among RQ's queue set (`rq:queues`, written on every enqueue)."""
    prefix = Queue.redis_queue_namespace_prefix
    names = (text(key)[len(prefix):] for key in redis.smembers(Queue.redis_queues_keys))
    return {name for name in names if is_dispatch_queue(name)}


def register_queues(redis, queue_names) -> None:
    """Make a worker's queues exist in RQ's queue set, so they stay in the union after the host is gone."""
    prefix = Queue.redis_queue_namespace_prefix
    redis.sadd(Queue.redis_queues_keys, *(prefix + name for name in queue_names))


def queue_union(redis, now: float | None = None, *, processes: bool = True) -> QueueUnion:
    """The union, with the registry's host rows (and their worker processes unless `processes` is false: a
    pause or resume needs only the queues)."""
    now = time.time() if now is None else now
    problems = []
    queues = {SHARED_QUEUE}
    hosts = None
    try:
        hosts = tuple(registry.read_hosts(redis, now, processes=processes))
        queues |= {host_queue(h.name) for h in hosts if h.declared and h.liveness != registry.GONE}
    except registry.RegistryUnreadable as exc:
        problems.append(str(exc))
    for source, read in (("RQ's queue set", existing_queues), ("pause flags", _flagged)):
        try:
            queues |= read(redis)
        except RedisError as exc:
            problems.append(f"{source} unreadable ({type(exc).__name__})")
    if len(problems) == 3:  # nothing answered: Redis itself is down, and that is the caller's error
        raise RedisError("; ".join(problems))
    if problems:
        last, seen_at = _last_union(redis)
        queues |= last
        if seen_at:
            problems.append(f"kept the {len(last)} queue(s) last seen "
                            f"{time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(seen_at))}")
    else:
        _remember(redis, queues, now)
    ordered = tuple([SHARED_QUEUE] + sorted(queues - {SHARED_QUEUE}))
    return QueueUnion(queues=ordered, hosts=hosts, degraded="; ".join(problems))


def _flagged(redis) -> set[str]:
    return {name for name in (text(n) for n in redis.smembers(pauses.INDEX)) if is_dispatch_queue(name)}


def _remember(redis, queues: set[str], now: float) -> None:
    with contextlib.suppress(RedisError):
        redis.set(LAST_UNION, json.dumps({"at": now, "queues": sorted(queues)}))


def _last_union(redis) -> tuple[set[str], float | None]:
    try:
        data = json.loads(redis.get(LAST_UNION) or "{}")
        return {q for q in data.get("queues", []) if isinstance(q, str) and is_dispatch_queue(q)}, data.get("at")
    except (RedisError, ValueError, AttributeError):
        return set(), None


def resolve_scope(redis, *, queue: str | None = None, host: str | None = None, all_queues: bool = False):
    """`--queue Q`, `--host H` (its host queue) or `--all` (the union) -> (queues, degraded)."""
    if sum(bool(x) for x in (queue, host, all_queues)) != 1:
        raise ValueError("say which queues: exactly one of --queue Q, --host H or --all")
    if queue:
        if not is_dispatch_queue(queue):
            raise ValueError(f"{queue!r} is not a pidispatch queue ({SHARED_QUEUE} or {SHARED_QUEUE}@<host>)")
        return [queue], ""
    if host:
        return [host_queue(host)], ""
    union = queue_union(redis, processes=False)
    return list(union.queues), union.degraded
