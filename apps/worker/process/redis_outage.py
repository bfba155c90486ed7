"""Riding out a Redis outage while a job runs (security review #14, item 7).

A running job needs Redis only at its edges: RQ's heartbeats while it runs, and the write of its result
when it ends. A worker that died at the first failed heartbeat took its work horse with it and left the
container running with its token, so instead:

- the worker's main process keeps watching the horse through an outage of up to PI_REDIS_OUTAGE_SECONDS,
  and RQ's heartbeat TTL covers that long, so no other worker's cleanup takes the job for abandoned;
- the horse, once its job has ended (and been recorded: the database is the record), waits as long for
  Redis before RQ writes the result;
- past that, the worker gives the job up: horse and container stopped, the attempt recorded `worker-lost`
  (apps/worker/process/worker_lost.py, give_up) and the worker quits, as RQ does when Redis is gone.

An idle worker waits for Redis as long as it takes (the dequeue loop); there is nothing to lose.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from django.conf import settings
from redis.exceptions import RedisError

logger = logging.getLogger("pidispatch.worker")

PING_INTERVAL_SECONDS = 0.5


class Outage:
    """When Redis stopped answering this process, if it has."""

    def __init__(self) -> None:
        self.since: float | None = None

    def failed(self, error: RedisError) -> None:
        if self.since is None:
            self.since = time.monotonic()
            logger.warning("redis_unreachable error=%s", type(error).__name__)

    def answered(self) -> None:
        if self.since is not None:
            logger.info("redis_restored after_seconds=%.1f", self.seconds())
            self.since = None

    @contextmanager
    def noted(self):
        """A Redis error in the block is noted, not raised; the block's success ends the outage."""
        try:
            yield
        except RedisError as error:
            self.failed(error)
        else:
            self.answered()

    def seconds(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def outlasted(self) -> bool:
        """Longer than a running job rides out."""
        return self.since is not None and self.seconds() > settings.PI_REDIS_OUTAGE_SECONDS


def answers(connection) -> bool:
    try:
        connection.ping()
    except RedisError:
        return False
    return True


def wait_until_answered(connection, seconds: float) -> bool:
    """Block until Redis answers a PING, for at most `seconds`. False when it never did."""
    outage = Outage()
    while True:
        try:
            connection.ping()
        except RedisError as error:
            outage.failed(error)
            if outage.seconds() > seconds:
                return False
            time.sleep(PING_INTERVAL_SECONDS)
            continue
        outage.answered()
        return True
