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
