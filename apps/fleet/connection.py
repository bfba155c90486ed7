"""The one Redis connection pool of a process (redis-py pools are fork-aware)."""

from functools import cache

import redis
from django.conf import settings


@cache
def _client(url: str) -> redis.Redis:
    # Short timeouts: a Redis outage must turn into a fast, handled error on the webhook path,
    # never a hung request.
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=30)


def get_redis() -> redis.Redis:
    return _client(settings.REDIS_URL)


def text(reply) -> str:
    """A Redis reply as text (the pool does not decode, RQ's pickled payloads need bytes); None is ""."""
    return reply.decode() if isinstance(reply, bytes) else (reply or "")


def process_run_id(redis) -> str:
    """The Redis process's run id: another one after any restart, empty or from an older copy of its data."""
    return redis.info("server").get("run_id", "")


def unmarked_run_id(redis, marker: str) -> str | None:
    """This Redis process's run id when `marker` does not hold it (what the marker stands for was not done into this
    process yet: it restarted empty, or from an older copy), else None. The fleet's switches (apps/fleet/state.py),
    the accepted jobs (apps/worker/accepted.py) and the budget windows (apps/worker/gates/budget_rebuild.py) are each
    rebuilt into a Redis once, told apart this way."""
    run_id = process_run_id(redis)
    if run_id and text(redis.get(marker) or b"") == run_id:
        return None
    return run_id
