"""Drain and undrain, per host: a host's workers stop taking jobs from every queue they serve (its own queue and
the shared one) while the rest of the fleet goes on; their running jobs finish. How a host is upgraded or taken
down without losing a job (docs/deploying.md).

Drained is not paused: a pause is a queue's and stops every host that serves it; a drain is a host's and stops
only that host. A drained host's own queue keeps its jobs until the host is undrained (or another host of the
same name takes over).

Each drain is also a row of the record (HostDrain), from which state.py rebuilds the flag when Redis lost its data.

Redis keys (no expiry: a drain outlives every process of the host, its restarts and upgrades included):
    pidispatch:drain:<host>   HASH by, at (ISO), note
    pidispatch:drained        SET  the drained host names
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from . import audit, registry, state
from .connection import text
from .queues import host_queue, is_valid_host_name

logger = logging.getLogger("pidispatch.fleet")

INDEX = "pidispatch:drained"
NOTE_MAX = 500


def flag_key(host: str) -> str:
    return f"pidispatch:drain:{host}"


@dataclass(frozen=True)
class DrainFlag:
    host: str
    by: str
    at: datetime | None
    note: str = ""


def _checked(host: str) -> str:
    if not is_valid_host_name(host):
        raise ValueError(f"{host!r} is not a host name")
    return host


def write_flag(pipe, host: str, *, by: str, at: datetime, note: str) -> None:
    """The host's drain flag (a drained host keeps its first drain's who, when and note), queued on `pipe`; its
    last command answers whether the host is newly drained."""
    pipe.hsetnx(flag_key(host), "by", by)
    pipe.hsetnx(flag_key(host), "at", at.isoformat())
    pipe.hsetnx(flag_key(host), "note", (note or "")[:NOTE_MAX])
    pipe.sadd(INDEX, host)


def drain(redis, host: str, *, by: str, note: str = "") -> str:
    """Mark the host drained (again: the first drain's note and time stand). Returns the audit error, if any (and
    the record's, when the drain could not be written to the database)."""
    host = _checked(host)
    now = timezone.now()
    with redis.pipeline() as pipe:
        write_flag(pipe, host, by=by, at=now, note=note)
        new = pipe.execute()[3]
    logger.info("fleet_drain host=%s new=%d", host, new)
    unrecorded = state.record_drain(host, by=by, at=now, note=(note or "")[:NOTE_MAX])
    outcome = f"host {host} drained" if new else f"host {host} was drained already"
    error = audit.record("drain", actor=by, queues=[host_queue(host)], note=note,
                         outcome=outcome + (f" [{unrecorded}]" if unrecorded else ""))
    return "; ".join(said for said in (unrecorded, error) if said)


def undrain(redis, host: str, *, by: str) -> tuple[bool, str]:
    """(whether it was drained, the audit error)."""
    host = _checked(host)
    with redis.pipeline() as pipe:
        pipe.delete(flag_key(host))
        pipe.srem(INDEX, host)
        deleted, removed = pipe.execute()
    was = bool(deleted or removed)
    unrecorded = state.forget_drain(host)
    logger.info("fleet_undrain host=%s was_drained=%d", host, was)
    error = audit.record("undrain", actor=by, queues=[host_queue(host)],
                         outcome=f"host {host} undrained" if was else f"host {host} was not drained") if was else ""
    return was, "; ".join(said for said in (unrecorded, error) if said)


def is_drained(redis, host: str) -> bool:
    """The worker's check, once a second."""
    return bool(redis.exists(flag_key(host)))


def read_flags(redis) -> dict[str, DrainFlag]:
    with contextlib.suppress(state.StateUnknown):
        state.ensure_restored(redis)  # a Redis that lost its data is given the recorded drains first
    names = sorted(name for name in (text(n) for n in redis.smembers(INDEX)) if is_valid_host_name(name))
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(flag_key(name))
    flags = {}
    for name, raw in zip(names, pipe.execute(), strict=True):
        data = {text(k): text(v) for k, v in raw.items()}
        at = data.get("at", "")
        flags[name] = DrainFlag(host=name, by=data.get("by", ""), at=datetime.fromisoformat(at) if at else None,
                                note=data.get("note", ""))
    return flags


@dataclass
class DrainProgress:
    """What a drained host still runs, and which of its workers have not yet said they saw the drain, as its workers
    last reported it. A worker says so before it takes another job, so one that took a job a moment before the drain
    is either listed as running it or not yet settled: never missed (a restart then would kill that job)."""

    host: str
    running: list[str] = field(default_factory=list)
    known: bool = True  # the registry has the host (a host never seen cannot be said to be idle)
    unsettled: list[str] = field(default_factory=list)  # its workers that have not yet seen the drain

    @property
    def idle(self) -> bool:
        return self.known and not self.running and not self.unsettled


def progress(redis, host: str) -> DrainProgress:
    row = next((h for h in registry.read_hosts(redis) if h.name == host), None)
    if row is None:
        return DrainProgress(host, known=False)
    if row.liveness == registry.GONE:
        return DrainProgress(host)  # no process left: nothing runs there
    # A worker of the release before `drain_seen` (None) says only what it runs, as it always did.
    unsettled = sorted(p.worker_name for p in row.processes if p.drain_seen is False and not p.job)
    return DrainProgress(host, running=sorted(job.job_id for job in row.running), unsettled=unsettled)


def wait_until_idle(redis, host: str, seconds: float, on_wait=None) -> DrainProgress:
    """Until the host runs nothing, or `seconds` pass; `on_wait(progress)` every few seconds for the operator."""
    deadline = time.monotonic() + seconds
    last_said = 0.0
    while True:
        now = progress(redis, host)
        if now.idle or time.monotonic() >= deadline:
            return now
        if on_wait and time.monotonic() - last_said >= 5:
            on_wait(now)
            last_said = time.monotonic()
        time.sleep(0.5)
