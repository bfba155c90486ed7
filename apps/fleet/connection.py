"""The one Redis connection pool of a process (redis-py pools are fork-aware): the Redis at REDIS_URL or, when
REDIS_SENTINELS is set, the primary the sentinels name for REDIS_SENTINEL_MASTER (REDIS_URL's database and
password still apply). Sentinel (redis-py's `redis.sentinel`) does the failover; what this module adds is that a
command arriving during the switch waits for the new primary, for PI_REDIS_FAILOVER_WAIT_SECONDS, instead of
failing. Every client of the product comes from here (RQ's through `rq_queue_config`), so every process follows a
failover the same way."""

from __future__ import annotations

import time
from functools import cache
from urllib.parse import urlsplit, urlunsplit

import redis
from django.conf import settings
from redis.backoff import ExponentialBackoff
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

# The default pool's timeouts: a Redis outage must turn into a fast, handled error on the webhook path, never a
# hung request.
CONNECT_TIMEOUT = 2
SOCKET_TIMEOUT = 5
# The sentinels answer "who is the primary" from memory: a sentinel that takes longer is as good as down.
SENTINEL_TIMEOUT = 1


class RetryUntil(Retry):
    """redis-py's retry of a command that met a connection error, bounded by time rather than by a count: with
    Sentinel each attempt asks the sentinels for the primary again, so it ends as soon as the new one answers, and
    gives up `seconds` after the first attempt."""

    def __init__(self, seconds: float):
        super().__init__(ExponentialBackoff(cap=1.0, base=0.05), retries=-1)
        self.seconds = seconds

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        deadline = time.monotonic() + self.seconds

        def retryable(error) -> bool:
            return time.monotonic() < deadline and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)

    def __eq__(self, other):
        return isinstance(other, RetryUntil) and other.seconds == self.seconds

    __hash__ = Retry.__hash__


def sentinel_addresses(text: str) -> tuple[tuple[str, int], ...]:
    """REDIS_SENTINELS (`host:port,host:port`) as addresses; a ValueError that says what is wrong."""
    addresses = []
    for item in (part.strip() for part in (text or "").split(",")):
        if not item:
            continue
        host, separator, port = item.rpartition(":")
        host = host.strip("[]")
        if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"REDIS_SENTINELS: {item!r} is not host:port (e.g. 10.0.0.5:26379)")
        addresses.append((host, int(port)))
    return tuple(addresses)


def _url_parts(url: str) -> dict:
    parts = parse_url(url)
    return {"db": int(parts.get("db") or 0), "username": parts.get("username"), "password": parts.get("password")}


def rq_queue_config(url: str, sentinels, master: str, sentinel_password: str, wait_seconds: float) -> dict:
    """django-rq's connection entry of RQ_QUEUES: REDIS_URL, or the same database behind the sentinels."""
    if not sentinels:
        return {"URL": url, "DEFAULT_TIMEOUT": 3600}
    parts = _url_parts(url)
    return {"SENTINELS": list(sentinels), "MASTER_NAME": master, "DB": parts["db"], "USERNAME": parts["username"],
            "PASSWORD": parts["password"], "DEFAULT_TIMEOUT": 3600,
            "CONNECTION_KWARGS": {"socket_connect_timeout": CONNECT_TIMEOUT, "retry": RetryUntil(wait_seconds)},
            "SENTINEL_KWARGS": _sentinel_kwargs(sentinel_password)}


def _sentinel_kwargs(password: str) -> dict:
    return {"socket_connect_timeout": SENTINEL_TIMEOUT, "socket_timeout": SENTINEL_TIMEOUT,
            "password": password or None}


@cache
def _client(url: str, sentinels: tuple, master: str, sentinel_password: str, wait_seconds: float,
            connect_timeout: float, socket_timeout: float) -> redis.Redis:
    if not sentinels:
        return redis.Redis.from_url(url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout,
                                    health_check_interval=30)
    options = {**_url_parts(url), "socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout,
               "health_check_interval": 30}
    if wait_seconds > 0:
        options["retry"] = RetryUntil(wait_seconds)
    return sentinel_of(sentinels, sentinel_password).master_for(master, **options)


@cache
def sentinel_of(sentinels: tuple, password: str) -> Sentinel:
    return Sentinel(list(sentinels), sentinel_kwargs=_sentinel_kwargs(password))


def redis_client(connect_timeout: float = CONNECT_TIMEOUT, socket_timeout: float = SOCKET_TIMEOUT, *,
                 waits: bool = True) -> redis.Redis:
    """A client of the fleet's Redis with these timeouts. `waits=False`: a best-effort caller that must not wait
    out a failover (it gives up at once and lets the next one do it)."""
    wait = settings.PI_REDIS_FAILOVER_WAIT_SECONDS if waits else 0
    return _client(settings.REDIS_URL, tuple(settings.REDIS_SENTINELS), settings.REDIS_SENTINEL_MASTER,
                   settings.REDIS_SENTINEL_PASSWORD, wait, connect_timeout, socket_timeout)


def get_redis() -> redis.Redis:
    return redis_client()


class CachePool:
    """`pool_class` of Django's Redis cache (settings.CACHES["api"]): its pool is this module's, so the cache finds
    the primary as every other client does."""

    @staticmethod
    def from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT, **options):
        return redis_client(socket_connect_timeout, socket_timeout).connection_pool


def where() -> str:
    """Where this process looks for Redis, for messages: REDIS_URL without its password, or the sentinels."""
    if settings.REDIS_SENTINELS:
        listed = ",".join(f"{host}:{port}" for host, port in settings.REDIS_SENTINELS)
        return f"the primary of {settings.REDIS_SENTINEL_MASTER!r} (sentinels {listed})"
    parts = urlsplit(settings.REDIS_URL)
    if not parts.hostname:
        return urlunsplit((parts.scheme, "", parts.path, "", ""))  # unix:///path
    return urlunsplit((parts.scheme, parts.hostname + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))


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
