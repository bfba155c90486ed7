"""The fleet's switches as the database records them, and Redis rebuilt from that record when it lost its data.

Pauses (pauses.py), drains (drains.py) and cancel requests (cancel.py) are keys in Redis, which every worker reads
each second; each change is also a row (QueuePause, HostDrain, CancelRequest), written right after the key (the
stop switch never waits on the database; a row that could not be written is said in the change's report). Redis
then is a cache of the record:

- `pidispatch:state:restored` holds the run id of the Redis process the record was last restored into. A Redis that
  restarted empty has no such key; one restarted from an older copy of its data (a snapshot, a replica promoted)
  has a new run id. Either way the key no longer matches, and the next reader restores every recorded pause and
  drain, and every cancel request not yet expired, into it (adding to what it holds: a key the record lacks,
  written while the database was away, stays).
- A worker asks before each turn of its dequeue loop (`ensure_restored`), so no job is taken from a queue whose
  pause Redis forgot; a worker that cannot read the record then takes nothing (`StateUnknown`) until it can.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import DatabaseError, transaction
from django.utils import timezone

from .connection import unmarked_run_id

logger = logging.getLogger("pidispatch.fleet")

RESTORED = "pidispatch:state:restored"


class StateUnknown(Exception):
    """Redis lost its data and the record cannot be read: no one can tell which queues are paused."""


def _said(error: Exception) -> str:
    return f"not recorded in the database ({type(error).__name__}): it holds only while Redis keeps its data"


def record_pauses(flags) -> str:
    """Each pause flag's row, as Redis holds the flag (a row there already is left as it is). "" or what went
    wrong, for the report."""
    from .models import QueuePause

    try:
        with transaction.atomic():
            for flag in flags:
                QueuePause.objects.get_or_create(queue=flag.queue, defaults={
                    "by": flag.by, "at": flag.at or timezone.now(), "note": flag.note, "until": flag.until})
    except DatabaseError as error:
        logger.error("fleet_pause_unrecorded queues=%s error=%s", ",".join(flag.queue for flag in flags),
                     type(error).__name__)
        return _said(error)
    return ""


def forget_pauses(queues, *, expired_by: datetime | None = None) -> str:
    """The queues' pause rows gone (an auto-resume: only rows whose `until` has passed)."""
    from .models import QueuePause

    rows = QueuePause.objects.filter(queue__in=list(queues))
    if expired_by is not None:
        rows = rows.filter(until__lte=expired_by)
    try:
        rows.delete()
    except DatabaseError as error:
        logger.error("fleet_resume_unrecorded queues=%s error=%s", ",".join(queues), type(error).__name__)
        return (f"not recorded in the database ({type(error).__name__}): the pause would come back if Redis lost "
                f"its data; resume again")
    return ""


def record_drain(host: str, *, by: str, at: datetime, note: str) -> str:
    from .models import HostDrain

    try:
        HostDrain.objects.get_or_create(host=host, defaults={"by": by, "at": at, "note": note})
    except DatabaseError as error:
        logger.error("fleet_drain_unrecorded host=%s error=%s", host, type(error).__name__)
        return _said(error)
    return ""


def forget_drain(host: str) -> str:
    from .models import HostDrain

    try:
        HostDrain.objects.filter(host=host).delete()
    except DatabaseError as error:
        logger.error("fleet_undrain_unrecorded host=%s error=%s", host, type(error).__name__)
        return f"not recorded in the database ({type(error).__name__}): undrain again"
    return ""


def record_cancel(job_id: str, *, by: str, at: datetime, seconds: int) -> str:
    from .models import CancelRequest

    try:
        CancelRequest.objects.update_or_create(job_id=job_id, defaults={"by": by, "at": at,
                                                                        "until": at + timedelta(seconds=seconds)})
    except DatabaseError as error:
        logger.error("fleet_cancel_unrecorded job=%s error=%s", job_id, type(error).__name__)
        return _said(error)
    return ""


def ensure_restored(redis) -> bool:
    """Restore the record into Redis unless it was restored into this very Redis process. Whether it restored now.
    Raises StateUnknown when it had to and could not read the record; RedisError as Redis raises it."""
    run_id = unmarked_run_id(redis, RESTORED)
    if run_id is None:
        return False
    restore(redis, run_id)
    return True


def restore(redis, run_id: str) -> None:
    from . import cancel, drains, pauses
    from .models import CancelRequest, HostDrain, QueuePause

    now = timezone.now()
    try:
        recorded_pauses = [row for row in QueuePause.objects.all() if row.until is None or row.until > now]
        recorded_drains = list(HostDrain.objects.all())
        CancelRequest.objects.filter(until__lte=now).delete()
        recorded_cancels = list(CancelRequest.objects.all())
    except DatabaseError as error:
        logger.error("fleet_state_unknown why=database-unavailable error=%s", type(error).__name__)
        raise StateUnknown from None
    pipe = redis.pipeline(transaction=True)
    for row in recorded_pauses:
        pauses.write_flag(pipe, row.queue, by=row.by, at=row.at, note=row.note, until=row.until)
    for row in recorded_drains:
        drains.write_flag(pipe, row.host, by=row.by, at=row.at, note=row.note)
    for row in recorded_cancels:
        cancel.write_request(pipe, row.job_id, by=row.by, at=row.at,
                             seconds=max(1, int((row.until - now).total_seconds())), keep=True)
    pipe.set(RESTORED, run_id)
    pipe.execute()
    logger.warning("fleet_state_restored redis_run=%s pauses=%d drains=%d cancels=%d", run_id[:12],
                   len(recorded_pauses), len(recorded_drains), len(recorded_cancels))
