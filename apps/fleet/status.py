"""One read of the whole fleet: the queue union with counts and pause state, the host rows, the jobs
that wait and why, and the latest failed jobs. `fleet status` and the admin panel both show this.

Redis only: it must answer when the database is down.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from rq import Queue
from rq.job import Job
from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.utils import utcparse

from . import drains, host_usage, pauses, registry, waiting
from .connection import text
from .display import iso_instant
from .queues import host_of_queue
from .union import queue_union

RUNNING, PAUSED, PART_PAUSED = "RUNNING", "PAUSED", "PART PAUSED"
FAILED_SHOWN = 20


@dataclass(frozen=True)
class QueueState:
    name: str
    host: str | None
    queued: int
    scheduled: int
    running: int
    failed: int
    pause: pauses.PauseFlag | None = None

    @property
    def paused(self) -> bool:
        return self.pause is not None


@dataclass(frozen=True)
class FailedJob:
    job_id: str
    queue: str
    failed_at: float | None


@dataclass
class FleetSnapshot:
    taken_at: float
    queues: list[QueueState]
    hosts: list[registry.HostRow] | None
    waiting: list[waiting.WaitingJob] = field(default_factory=list)
    failed: list[FailedJob] = field(default_factory=list)
    degraded: str = ""
    drained: dict[str, drains.DrainFlag] = field(default_factory=dict)  # by host (a drain is not a pause)
    usage: dict[str, host_usage.Usage] = field(default_factory=dict)  # by host: what its jobs use of its budget

    @property
    def state(self) -> str:
        paused = sum(1 for q in self.queues if q.paused)
        return RUNNING if not paused else PAUSED if paused == len(self.queues) else PART_PAUSED

    @property
    def totals(self) -> dict[str, int]:
        return {name: sum(getattr(q, name) for q in self.queues)
                for name in ("queued", "scheduled", "running", "failed")}

    def as_json(self) -> dict:
        def pause(flag):
            if flag is None:
                return None
            return {"by": flag.by, "at": flag.at.isoformat() if flag.at else None, "note": flag.note,
                    "until": flag.until.isoformat() if flag.until else None}

        return {
            "state": self.state,
            "taken_at": iso_instant(self.taken_at),
            "degraded": self.degraded or None,
            "totals": self.totals,
            "queues": [{**{k: v for k, v in asdict(q).items() if k != "pause"}, "paused": q.paused,
                        "pause": pause(q.pause)} for q in self.queues],
            "hosts": None if self.hosts is None else [{
                "name": h.name, "liveness": h.liveness, "beat_at": iso_instant(h.beat_at),
                "beat_age_seconds": None if h.beat_at is None else round(h.beat_age(self.taken_at), 1),
                "started_at": iso_instant(h.started_at), "version": h.version, "declared": h.declared,
                "routes": h.routes,
                "processes": len(h.processes), "busy": h.busy, "concurrency": h.concurrency, "queues": list(h.queues),
                "capabilities": list(h.capabilities), "image": h.image,
                "budget": {"memory_mib": _bound(h.budget_memory), "cpus": _bound(h.budget_cpus, 100)},
                "in_use": self.usage[h.name].as_json() if h.name in self.usage else None,
                "drained": None if h.name not in self.drained else {
                    "by": self.drained[h.name].by, "note": self.drained[h.name].note,
                    "at": self.drained[h.name].at.isoformat() if self.drained[h.name].at else None},
                "running": [{"job_id": j.job_id, "started_at": iso_instant(j.started_at), "target": j.target,
                             "queue": j.queue} for j in h.running],
            } for h in self.hosts],
            "waiting": [{**asdict(w), "until": iso_instant(w.until), "since": iso_instant(w.since)}
                        for w in self.waiting],
            "failed": [{**asdict(f), "failed_at": iso_instant(f.failed_at)} for f in self.failed],
        }



def snapshot(redis, now: float | None = None) -> FleetSnapshot:
    now = time.time() if now is None else now
    union = queue_union(redis, now)
    names = list(union.queues)
    flags = pauses.read_flags(redis)
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.llen(Queue(name, connection=redis).key)
        pipe.zcard(ScheduledJobRegistry(name, connection=redis).key)
        pipe.zcard(StartedJobRegistry(name, connection=redis).key)
        pipe.zcard(FailedJobRegistry(name, connection=redis).key)
        pipe.zrevrange(FailedJobRegistry(name, connection=redis).key, 0, FAILED_SHOWN - 1, withscores=True)
    replies = pipe.execute()
    queues, failed = [], []
    for index, name in enumerate(names):
        queued, scheduled, running, failed_count, latest = replies[index * 5:index * 5 + 5]
        queues.append(QueueState(name=name, host=host_of_queue(name), queued=queued, scheduled=scheduled,
                                 running=running, failed=failed_count, pause=flags.get(name)))
        failed += [(text(job_id), name) for job_id, _ in latest]
    hosts = None if union.hosts is None else list(union.hosts)
    return FleetSnapshot(
        taken_at=now, queues=queues, hosts=hosts,
        waiting=waiting.list_waiting(redis, names), failed=_latest_failures(redis, failed), degraded=union.degraded,
        drained=drains.read_flags(redis), usage=host_usage.usages(redis, [h.name for h in hosts or ()]),
    )


def _bound(value: str, per: int = 1):
    """A host's budget as its row says it: a number, `off`, or None when the host does not say."""
    if value.isdigit():
        return int(value) / per if per != 1 else int(value)
    return value or None


def _latest_failures(redis, candidates: list[tuple[str, str]]) -> list[FailedJob]:
    """The newest failures by the job's own end time (the registry's score is an expiry, per-job TTL)."""
    pipe = redis.pipeline(transaction=False)
    for job_id, _ in candidates:
        pipe.hget(Job.key_for(job_id), "ended_at")
    failed = []
    for (job_id, queue), ended in zip(candidates, pipe.execute(), strict=True):
        try:
            ended_at = utcparse(text(ended)).timestamp() if ended else None
        except ValueError:
            ended_at = None
        failed.append(FailedJob(job_id=job_id, queue=queue, failed_at=ended_at))
    failed.sort(key=lambda f: f.failed_at or 0, reverse=True)
    return failed[:FAILED_SHOWN]
