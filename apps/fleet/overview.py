"""The admin front page's status strip: what state the system is in, in one line of boxes.

Display code like panel.py (it reads the worker's counters and the inbox). Each part is read on its own, so
Redis being down still shows the database's numbers and the other way round; a part that cannot be read
says so instead of showing zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from . import panel, status


@dataclass
class Strip:
    state: str = ""                      # RUNNING | PAUSED | PART PAUSED | "" (unknown)
    paused_queues: int = 0
    queues: int = 0
    pause_by: str = ""
    pause_note: str = ""
    pause_until: object = None
    hosts_live: int | None = None
    hosts_total: int | None = None
    queued: int | None = None
    deferred: int | None = None
    running: int | None = None
    failed_in_queues: int | None = None
    failed_today: int | None = None
    spend: panel.Spend | None = None
    inbox_pending: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def day_meter(self):
        return next((meter for meter in self.spend.meters if meter.window == "day"), None) if self.spend else None


def strip(redis) -> Strip:
    from apps.receiver.models import Delivery, DeliveryStatus
    from apps.worker.models import Run

    found = Strip()
    try:
        snap = status.snapshot(redis)
        paused = [queue for queue in snap.queues if queue.paused]
        found.state, found.paused_queues, found.queues = snap.state, len(paused), len(snap.queues)
        if paused:
            latest = max(paused, key=lambda queue: queue.pause.at.timestamp() if queue.pause.at else 0).pause
            found.pause_by, found.pause_note, found.pause_until = latest.by, latest.note, latest.until
        if snap.hosts is not None:
            found.hosts_total = len(snap.hosts)
            found.hosts_live = sum(1 for host in snap.hosts if host.liveness == "live")
        totals = snap.totals
        found.queued, found.deferred, found.running = totals["queued"], totals["scheduled"], totals["running"]
        found.failed_in_queues = totals["failed"]
    except RedisError as exc:
        found.problems.append(f"Redis unreachable ({type(exc).__name__}): fleet state and queues unknown")
    try:
        day_start = panel.windows(timezone.now())["day"]
        found.failed_today = Run.objects.failed_jobs_since(day_start)
        found.inbox_pending = Delivery.objects.filter(
            status__in=(DeliveryStatus.PENDING, DeliveryStatus.RECEIVED)).count()
    except DatabaseError as exc:
        found.problems.append(f"database unreadable ({type(exc).__name__}): runs and inbox unknown")
    try:
        found.spend = panel.spend(redis)
    except (DatabaseError, RedisError) as exc:
        found.problems.append(f"spend unreadable ({type(exc).__name__})")
    return found
