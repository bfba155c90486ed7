"""Wait-for (`run.waitFor`): hold a job until every condition clears.

Conditions: `{"after": "<ISO instant with zone>"}` (at most one, at most 30 days out) and
`{"profile": "<name>"}` — a check script from PI_WAIT_PROFILES, run with the job's target as its only
argument, no shell, 10 s timeout. Its exit code: 0 go, 3 not yet, 2 never (`wait-refused`), 1 or
anything else a fault. Checks back off from PI_WAIT_INTERVAL_SECONDS to 15 minutes; a job gives up after
96 checks or 24 hours (`wait-expired`) or 5 faults in a row (`wait-unanswerable`).

The checks run under check slots (apps/worker/gates/wait_slots.py: PI_WAIT_CHECK_SLOTS per host and
fleet-wide). A job denied one is throttled, not refused: it looks again after max(PI_WAIT_THROTTLE_SECONDS,
backoff / 4) plus up to 10% jitter, its denials in a row are counted on its hold (the fifth logs one
`wait_capacity_exceeded` line), and past PI_WAIT_MAX_SECONDS it is `wait-expired` (max-wait-unchecked).

Every deferral hands the hold's counters to the job's wait note (apps/fleet/waiting.py), which is what
`held_jobs`, `fleet status` and the panel list.

Redis keys (every one expires):
    pidispatch:wait:job:<job id>     HASH since, checks, faults, denials, target, label  (the hold's state)
    pidispatch:wait:lease:<hash>     job id holding the wait for a target+flow+conditions
    pidispatch:wait:done:<hash>      job id that finished waiting (15 minutes)
A second delivery for the same target, flow and conditions while one waits, or just after it cleared,
is `wait-superseded`; while the waiting one's state cannot be read, it looks again in 15 s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from apps.fleet.capabilities import parse_profiles
from apps.worker.gates import wait_slots
from apps.worker.gates.hostscripts import run_script
from apps.worker.jobs import JobSpec

logger = logging.getLogger("pidispatch.waitfor")

PREFIX = "pidispatch:wait"
DONE_SECONDS = 15 * 60
SUPERSEDE_RECHECK_SECONDS = 15
THROTTLE_ALARM_DENIALS = 5
GO, NOT_YET, NEVER = 0, 3, 2
LIVE_STATUSES = {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.STARTED, JobStatus.DEFERRED}


@dataclass(frozen=True)
class Conditions:
    after: datetime | None
    profiles: tuple[str, ...]

    @property
    def label(self) -> str:
        parts = [f"after {self.after.isoformat()}"] if self.after else []
        parts += [f"profile {name}" for name in self.profiles]
        return " + ".join(parts)


@dataclass(frozen=True)
class WaitOutcome:
    """Exactly one of: go (continue), defer_until (hold), refuse (a reason token)."""

    go: bool = False
    defer_until: datetime | None = None
    refuse: str = ""
    detail: dict | None = None
    reason: str = "wait-for"  # a deferral's: `wait-throttled` when the job found no check slot


GO_ON = WaitOutcome(go=True)


class Unreadable(ValueError):
    pass


def parse_conditions(raw) -> Conditions:
    """The job's conditions, or Unreadable (a worker older than its producer must not guess)."""
    if not isinstance(raw, (list, tuple)) or not 1 <= len(raw) <= 4:
        raise Unreadable("waitFor holds 1 to 4 conditions")
    after, profiles = None, []
    for condition in raw:
        if not isinstance(condition, dict) or len(condition) != 1:
            raise Unreadable("each condition has exactly one key")
        (key, value), = condition.items()
        if key == "after" and after is None and isinstance(value, str):
            try:
                after = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise Unreadable("after is not an ISO instant") from None
            if after.tzinfo is None:
                raise Unreadable("after has no time zone")
        elif key == "profile" and isinstance(value, str) and value and value not in profiles:
            profiles.append(value)
        else:
            raise Unreadable(f"unknown or repeated condition {key!r}")
    return Conditions(after, tuple(profiles))


def _identity(spec: JobSpec, conditions: Conditions) -> str:
    material = json.dumps([spec.target, spec.flow_or_command, spec.trigger_id, conditions.label])
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def backoff_seconds(held_seconds: float) -> float:
    base = settings.PI_WAIT_INTERVAL_SECONDS
    ceiling = max(900, base)
    return min(ceiling, base * 2 ** int(held_seconds // (10 * base)))


def _job_is_live(redis, job_id: str) -> bool | None:
    """Whether the job is queued, scheduled or running; None when its state cannot be read."""
    try:
        job = Job.fetch(job_id, connection=redis)
    except NoSuchJobError:
        return False
    except Exception:  # unreadable: neither a live holder nor a gone one
        return None
    return job.get_status(refresh=False) in LIVE_STATUSES


def run_check(path: str, target: str) -> int | None:
    """The check's exit code, or None for a fault that produced none (timeout, spawn failure)."""
    return run_script([path, target], timeout_seconds=settings.PI_WAIT_CHECK_TIMEOUT_SECONDS).code


class WaitState:
    def __init__(self, redis, job_id: str):
        self.redis = redis
        self.job_id = job_id
        self.key = f"{PREFIX}:job:{job_id}"

    def hold(self, now: datetime, target: str, label: str, ttl_seconds: int) -> dict:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self.key, "since", now.timestamp())
            pipe.hset(self.key, mapping={"target": target, "label": label})
            pipe.expire(self.key, ttl_seconds)
            pipe.hgetall(self.key)
            values = pipe.execute()[-1]
        return {key.decode(): value.decode() for key, value in values.items()}

    def count(self, *, fault: bool) -> tuple[int, int]:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.key, "checks", 1)
            if fault:
                pipe.hincrby(self.key, "faults", 1)
            else:
                pipe.hset(self.key, "faults", 0)
            pipe.hget(self.key, "faults")
            checks, *_, faults = pipe.execute()
        return int(checks), int(faults or 0)

    def deny(self) -> int:
        """One more check slot denied; the denials in a row so far."""
        return int(self.redis.hincrby(self.key, "denials", 1))

    def grant(self) -> None:
        self.redis.hset(self.key, "denials", 0)

    def clear(self) -> None:
        self.redis.delete(self.key)


def gate(redis, spec: JobSpec, now: datetime) -> WaitOutcome:
    if not spec.wait_for:
        return GO_ON
    try:
        conditions = parse_conditions(list(spec.wait_for))
    except Unreadable:
        return WaitOutcome(refuse="wait-unreadable")
    profiles = parse_profiles(settings.PI_WAIT_PROFILES, "PI_WAIT_PROFILES")
    paths = {}
    for name in conditions.profiles:
        path = profiles.get(name)
        real = os.path.realpath(path) if path else ""
        if not real or not os.path.isfile(real) or not os.access(real, os.X_OK):
            return WaitOutcome(refuse="wait-profile-unknown")
        paths[name] = real
    if conditions.after and conditions.after > now + timedelta(days=settings.PI_WAIT_AFTER_MAX_DAYS):
        return WaitOutcome(refuse="wait-after-beyond-max")

    identity = _identity(spec, conditions)
    done_by = redis.get(f"{PREFIX}:done:{identity}")
    if done_by and done_by.decode() != spec.job_id:
        return WaitOutcome(refuse="wait-superseded")
    state = WaitState(redis, spec.job_id)
    max_seconds = settings.PI_WAIT_MAX_SECONDS
    lease_key = f"{PREFIX}:lease:{identity}"
    lease_ttl = int(max_seconds + 3600)
    if not redis.set(lease_key, spec.job_id, nx=True, ex=lease_ttl):
        holder = (redis.get(lease_key) or b"").decode()
        live = holder and holder != spec.job_id and _job_is_live(redis, holder)
        if live:
            return WaitOutcome(refuse="wait-superseded")
        if live is None:  # taking over a holder that may still wait would let both run
            logger.warning("wait_supersede_unverified job=%s holder=%s", spec.job_id, holder)
            return WaitOutcome(defer_until=now + timedelta(seconds=SUPERSEDE_RECHECK_SECONDS),
                               detail={"waitingOn": conditions.label, "holder": "unverified"})
        redis.set(lease_key, spec.job_id, ex=lease_ttl)

    values = state.hold(now, spec.target, conditions.label, ttl_seconds=lease_ttl)
    held_seconds = max(0.0, now.timestamp() - float(values["since"]))
    detail = {"waitingOn": conditions.label, "heldSeconds": int(held_seconds), "checks": int(values.get("checks", 0)),
              "faults": int(values.get("faults", 0))}

    if conditions.after and conditions.after > now + timedelta(seconds=1):
        return WaitOutcome(defer_until=conditions.after, detail=detail)

    # The target was claimed before a check slot is asked for: a superseded delivery never waits for one.
    with wait_slots.check_slots(redis, spec.job_id, len(conditions.profiles)) as denied:
        if denied:
            return _throttled(redis, state, lease_key, spec.job_id, denied, held_seconds, now, detail)
        if int(values.get("denials", 0)):
            state.grant()  # the run of denials ends here
        for name in conditions.profiles:
            code = run_check(paths[name], spec.target)
            logger.info("wait_check job=%s profile=%s code=%s", spec.job_id, name, code)
            if code == GO:
                continue
            if code == NEVER:
                _finish(redis, state, lease_key, spec.job_id)
                return WaitOutcome(refuse="wait-refused")
            checks, faults = state.count(fault=code != NOT_YET)
            detail.update(checks=checks, faults=faults, profile=name)
            if faults >= settings.PI_WAIT_MAX_FAULTS:
                _finish(redis, state, lease_key, spec.job_id)
                return WaitOutcome(refuse="wait-unanswerable")
            if checks >= settings.PI_WAIT_MAX_CHECKS or held_seconds >= max_seconds:
                _finish(redis, state, lease_key, spec.job_id)
                return WaitOutcome(refuse="wait-expired")
            delay = min(backoff_seconds(held_seconds), max(1.0, max_seconds - held_seconds))
            return WaitOutcome(defer_until=now + timedelta(seconds=delay), detail=detail)

    _finish(redis, state, lease_key, spec.job_id)
    redis.set(f"{PREFIX}:done:{identity}", spec.job_id, ex=DONE_SECONDS)
    logger.info("wait_cleared job=%s held_seconds=%d", spec.job_id, held_seconds)
    return GO_ON


def _throttled(redis, state: WaitState, lease_key: str, job_id: str, denied: wait_slots.Denied,
               held_seconds: float, now: datetime, detail: dict) -> WaitOutcome:
    """No check slot: the job comes back soon, uncounted as a check, until it is past its longest wait."""
    denials = state.deny()
    if denials == THROTTLE_ALARM_DENIALS:
        logger.warning("wait_capacity_exceeded job=%s where=%s denials=%d slots=%d concurrency=%d interval=%d "
                       "knobs=PI_WAIT_CHECK_SLOTS,PI_CONCURRENCY,PI_WAIT_INTERVAL_SECONDS", job_id, denied.where,
                       denials, denied.slots, denied.concurrency, settings.PI_WAIT_INTERVAL_SECONDS)
    if held_seconds >= settings.PI_WAIT_MAX_SECONDS:
        _finish(redis, state, lease_key, job_id)
        logger.info("wait_expired job=%s detail=max-wait-unchecked denials=%d", job_id, denials)
        return WaitOutcome(refuse="wait-expired", detail={"why": "max-wait-unchecked"})
    wait = max(settings.PI_WAIT_THROTTLE_SECONDS, backoff_seconds(held_seconds) / 4)
    delay = wait * (1 + 0.1 * random.random())  # jitter: throttled jobs do not all come back at once
    logger.info("wait_check_throttled job=%s where=%s slots=%d denials=%d delay_s=%.1f", job_id, denied.where,
                denied.slots, denials, delay)
    return WaitOutcome(defer_until=now + timedelta(seconds=delay), reason="wait-throttled",
                       detail={**detail, "denials": denials, "where": denied.where})


def _finish(redis, state: WaitState, lease_key: str, job_id: str) -> None:
    state.clear()
    if (redis.get(lease_key) or b"").decode() == job_id:
        redis.delete(lease_key)
