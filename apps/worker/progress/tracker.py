"""The work horse's side: each phase a job reaches, written to Redis as it happens (see the package's docstring).

Keys (one job's, all with a TTL):

    pidispatch:progress:<job id>       hash: attempt, host, state (running | deferred | ended), phases (JSON list of
                               [token, ISO time]), calls, tokens, cost (from the egress gateway's meter), updated,
                               outcome, reason, run (the record's pk once written), forge, delivery and trigger
                               (ids, for the page's links)
    pidispatch:progress:<job id>:log   the container's output so far, scrubbed and cut (only with PI_CAPTURE_JOB_LOGS)
    pidispatch:running-jobs            sorted set: job id -> when its climb began (the runs list's "running now")
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC

from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis

logger = logging.getLogger("pidispatch.progress")

PREFIX = "pidispatch:progress:"
RUNNING = "pidispatch:running-jobs"
ENDED_KEEP_SECONDS = 600  # the page of a job that just ended still finds its phases (and links its record)
TICK_SECONDS = 1.0
LIVE_LOG_BYTES = 64 * 1024  # the tail of the output the live page shows


def key(job_id: str) -> str:
    return f"{PREFIX}{job_id}"


def log_key(job_id: str) -> str:
    return f"{PREFIX}{job_id}:log"


def running_ttl() -> int:
    """A running job's keys outlive its longest possible run; a horse killed mid-run leaves them that long at most."""
    return int(settings.PI_JOB_TIMEOUT_SECONDS) + 600


class Progress:
    """One climb's phases. Every write is best effort: Redis down only makes the live page say less."""

    def __init__(self, job_id: str, *, host: str, attempt: int, redis=None, forge: str = "", delivery_id: str = "",
                 trigger_id: int | None = None):
        self.job_id = job_id
        self.redis = redis if redis is not None else get_redis()
        self.phases: list[list[str]] = []
        self._failed = False
        # Ids only: the page links the job's delivery and trigger while it runs, before any record names them.
        self._write({"attempt": attempt, "host": host, "state": "running", "outcome": "", "reason": "", "run": "",
                     "calls": "", "tokens": "", "cost": "", "forge": forge, "delivery": delivery_id,
                     "trigger": "" if trigger_id is None else trigger_id}, running=True)

    def queued(self, instant) -> None:
        """When the job was put on its queue (RQ's enqueue time): the first line of its page."""
        if instant is not None:
            if timezone.is_naive(instant):  # RQ before 2.0 kept naive UTC times
                instant = instant.replace(tzinfo=UTC)
            self.phases.append(["queued", instant.isoformat()])

    def passed(self, phase: str) -> None:
        """`phase` (a token: `workspace`, `container`, ...) was reached or passed now."""
        self.phases.append([phase, timezone.now().isoformat()])
        self._write({"phases": json.dumps(self.phases)})

    def usage(self, *, calls: int, tokens: int, cost) -> None:
        self._write({"calls": calls, "tokens": tokens, "cost": "" if cost is None else str(cost)})

    def output(self, text: str) -> None:
        try:
            self.redis.set(log_key(self.job_id), text.encode()[-LIVE_LOG_BYTES:], ex=running_ttl())
        except RedisError:
            self._warn()

    def deferred(self, reason: str, until) -> None:
        self.passed(f"deferred:{reason}")
        self._write({"state": "deferred", "reason": reason, "until": until.isoformat()}, running=False,
                    ttl=ENDED_KEEP_SECONDS)

    def ended(self, outcome: str, reason: str = "", run_pk: int | None = None) -> None:
        self.passed("recorded")
        self._write({"state": "ended", "outcome": outcome, "reason": reason, "run": run_pk or ""}, running=False,
                    ttl=ENDED_KEEP_SECONDS)

    def _write(self, fields: dict, *, running: bool | None = None, ttl: int | None = None) -> None:
        ttl = ttl or running_ttl()
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(key(self.job_id), mapping={**fields, "updated": timezone.now().isoformat()})
            pipe.expire(key(self.job_id), ttl)
            pipe.expire(log_key(self.job_id), ttl)
            if running is True:
                pipe.zadd(RUNNING, {self.job_id: timezone.now().timestamp()})
            elif running is False:
                pipe.zrem(RUNNING, self.job_id)
            pipe.execute()
        except RedisError:
            self._warn()

    def _warn(self) -> None:
        if not self._failed:
            self._failed = True
            logger.warning("progress_unwritten job=%s why=redis-unavailable", self.job_id)


class Ticker:
    """While the container runs: every second the gateway's count so far, and every other one (with capture on)
    the container's output, scrubbed. A thread of the work horse, stopped when the container ends."""

    def __init__(self, progress: Progress, *, meter, read_output: Callable[[], str | None] | None = None):
        self.progress = progress
        self.meter = meter
        self.read_output = read_output
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"progress-{progress.job_id}", daemon=True)

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._tick(output=False)  # the last count; the container is gone (its whole output goes to the kept log)

    def _loop(self) -> None:
        ticks = 0
        while not self._stop.wait(TICK_SECONDS):
            ticks += 1
            self._tick(output=ticks % 2 == 0)

    def _tick(self, *, output: bool) -> None:
        try:
            self.progress.usage(calls=self.meter.calls, tokens=self.meter.tokens_total,
                                cost=self.meter.known_cost())
            text = self.read_output() if output and self.read_output is not None else None
            if text is not None:
                self.progress.output(text)
        except Exception as exc:  # never the job's failure: the page only says less
            logger.warning("progress_tick_failed job=%s error=%s", self.progress.job_id, type(exc).__name__)
