"""Why a deferred or held job waits, and since when: the one view of waiting jobs, which the panel,
`fleet status`, `GET /jobs/{id}` and `held_jobs` (the jobs held on wait-for conditions) all read.

The worker class writes a note when a job returns `Deferred(until, reason, detail)`, takes it back when
the job runs again (a second deferral keeps the first `since`), and cancel forgets it. Only ids, names,
numbers and instants are kept: detail values that look like anything else are dropped. A held job's note
carries its hold's counters (waitingOn, checks, faults, denials), as the wait-for gate handed them over.

Redis keys:
    pidispatch:waiting:<job id>   HASH queue, reason, until, since (unix seconds), target, detail (JSON);
                                  expires a day after `until`
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime

from rq.registry import ScheduledJobRegistry

from .connection import text

# The kind of wait a deferral's reason is; any other reason is `deferred`, none at all a retry's backoff.
KINDS = {"wait-for": "held", "wait-throttled": "throttled"}  # throttled: held, denied a check slot (denials=n)
HELD_KINDS = ("held", "throttled")  # waiting on wait-for conditions
DETAIL_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
DETAIL_TEXT = re.compile(r"^[A-Za-z0-9 ._:+#!/@,=-]{0,120}$")
DETAIL_MAX_KEYS = 8
KEEP_AFTER_UNTIL = 24 * 3600


def note_key(job_id: str) -> str:
    return f"pidispatch:waiting:{job_id}"


@dataclass(frozen=True)
class WaitingJob:
    job_id: str
    queue: str
    kind: str  # held (wait-for) | throttled (held, no check slot) | deferred (pause window, busy scope, ...) |
    #            retry (backoff after a fault)
    reason: str
    until: float | None
    since: float | None = None
    target: str = ""
    detail: dict = field(default_factory=dict)


def clean_detail(detail) -> dict:
    """Ids, names, numbers and instants only; anything else is dropped rather than stored."""
    clean = {}
    for key, value in (detail or {}).items() if isinstance(detail, dict) else ():
        if len(clean) >= DETAIL_MAX_KEYS or not isinstance(key, str) or not DETAIL_KEY.fullmatch(key):
            continue
        if isinstance(value, (bool, int, float)):
            clean[key] = value
        elif isinstance(value, datetime):
            clean[key] = value.isoformat()
        elif isinstance(value, str) and DETAIL_TEXT.fullmatch(value):
            clean[key] = value
    return clean


def note(redis, job_id: str, *, queue: str, reason: str, until: datetime, detail=None, target: str = "",
         since: float | None = None) -> None:
    until_ts = until.timestamp()
    key = note_key(job_id)
    pipe = redis.pipeline(transaction=False)
    pipe.hset(key, mapping={
        "queue": queue, "reason": reason[:64], "until": f"{until_ts:.3f}", "since": f"{since or time.time():.3f}",
        "target": target[:300], "detail": json.dumps(clean_detail(detail)),
    })
    pipe.expireat(key, int(until_ts) + KEEP_AFTER_UNTIL)
    pipe.execute()


def take(redis, job_id: str) -> float | None:
    """The job runs again: forget its note, and hand back when it started waiting."""
    pipe = redis.pipeline(transaction=False)
    pipe.hget(note_key(job_id), "since")
    pipe.delete(note_key(job_id))
    since, _ = pipe.execute()
    try:
        return float(since) if since else None
    except ValueError:
        return None


def forget(redis, job_id: str) -> None:
    redis.delete(note_key(job_id))



def list_waiting(redis, queues, limit: int = 200) -> list[WaitingJob]:
    """Jobs in the scheduled registries of these queues, soonest first, with why each waits."""
    pipe = redis.pipeline(transaction=False)
    for queue in queues:
        pipe.zrange(ScheduledJobRegistry(queue, connection=redis).key, 0, limit - 1, withscores=True)
    scheduled = sorted(((text(job_id), queue, score) for queue, members in zip(queues, pipe.execute(), strict=True)
                        for job_id, score in members), key=lambda item: item[2])[:limit]
    pipe = redis.pipeline(transaction=False)
    for job_id, _, _ in scheduled:
        pipe.hgetall(note_key(job_id))
    waiting = []
    for (job_id, queue, score), raw in zip(scheduled, pipe.execute(), strict=True):
        data = {text(k): text(v) for k, v in raw.items()}
        reason = data.get("reason", "")
        try:
            detail = json.loads(data.get("detail") or "{}")
        except ValueError:
            detail = {}
        waiting.append(WaitingJob(
            job_id=job_id, queue=queue,
            kind=KINDS.get(reason, "deferred") if reason else "retry",
            reason=reason or "retry-backoff", until=score,
            since=float(data["since"]) if data.get("since") else None,
            target=data.get("target", ""), detail=detail if isinstance(detail, dict) else {},
        ))
    return waiting


def held_jobs(redis, queues, now: float | None = None) -> list[dict]:
    """The jobs of these queues held on wait-for conditions, longest held first: what each waits on, for how
    long, its checks and faults so far, and the check slots denied in a row to a throttled one."""
    now = time.time() if now is None else now
    held = [job for job in list_waiting(redis, queues, limit=10_000) if job.kind in HELD_KINDS]
    held.sort(key=lambda job: job.since if job.since is not None else now)
    return [{
        "job_id": job.job_id,
        "queue": job.queue,
        "target": job.target,
        "waiting_on": str(job.detail.get("waitingOn", "")),
        "held_seconds": max(0, round(now - job.since)) if job.since is not None else 0,
        "checks": _count(job.detail, "checks"),
        "faults": _count(job.detail, "faults"),
        "denials": _count(job.detail, "denials") if job.kind == "throttled" else 0,
        "next_look_at": job.until,
    } for job in held]


def _count(detail: dict, name: str) -> int:
    value = detail.get(name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
