"""Routing: which queue a job goes to, `pi-jobs` or `pi-jobs@<host>` (DESIGN section 4).

Host-affine work goes to the host queue: cron jobs and manual local runs to the host that holds the
folder (`host_affine_queue`), forge jobs that need a host-local capability (`queue_for`) to a live,
declared host that offers all of it, or, when none of those is live, to the queue of the one that offered
it last (its registry card is kept a day): the job waits there for that host to return, as a job whose agent
tags no running agent has waits in Buildkite, rather than going to a host that would refuse it. An
unreadable registry, or a capability no host has declared for a day, routes to the shared queue. Routing
never drops work.

The registry is read at most once per PI_FLEET_ROUTE_CACHE_SECONDS per process (a failed read is cached
too), so a burst of deliveries costs one read.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib

from django.conf import settings

from . import registry
from .connection import get_redis
from .hosts import HostIdentity, this_host
from .queues import SHARED_QUEUE, host_queue

logger = logging.getLogger("pidispatch.fleet")

_cache: dict = {"at": float("-inf"), "hosts": ()}
_lock = threading.Lock()


def clear_cache() -> None:
    with _lock:
        _cache.update(at=float("-inf"), hosts=())


def _routable_hosts() -> tuple[registry.HostRow, ...]:
    with _lock:
        now = time.monotonic()
        if now - _cache["at"] < settings.PI_FLEET_ROUTE_CACHE_SECONDS:
            return _cache["hosts"]
        try:
            hosts = tuple(h for h in registry.read_hosts(get_redis(), processes=False) if h.declared)
        except Exception as exc:  # routing is a hint: every failure means the shared queue
            logger.warning("fleet_routing_registry_unreadable error=%s", type(exc).__name__)
            hosts = ()
        _cache.update(at=now, hosts=hosts)
        return hosts


def queue_for(needs: frozenset[str] = frozenset(), job_id: str = "") -> str:
    """The queue for a job needing these capability names (`secrets:<profile>`, `wait:<profile>`).

    A live, declared host that offers every need; with several, the job id picks one deterministically
    (so replicas spread), else the first by name. None live: the one that offered it last. No needs, or no
    host offering them: `pi-jobs`.
    """
    if not needs:
        return SHARED_QUEUE
    offering = [h for h in _routable_hosts() if set(needs) <= set(h.capabilities)]
    capable = sorted(h.name for h in offering if h.routes)
    if not capable and offering:
        last = max(offering, key=lambda h: h.beat_at or 0)
        logger.info("fleet_routed job=%s host=%s needs=%s why=no-live-capable-host liveness=%s", job_id or "-",
                    last.name, ",".join(sorted(needs)), last.liveness)
        return host_queue(last.name)
    if not capable:
        logger.info("fleet_route_shared needs=%s why=no-capable-host", ",".join(sorted(needs)))
        return SHARED_QUEUE
    index = zlib.crc32(job_id.encode()) % len(capable) if job_id else 0
    logger.info("fleet_routed job=%s host=%s needs=%s", job_id or "-", capable[index], ",".join(sorted(needs)))
    return host_queue(capable[index])


def host_affine_queue(host: HostIdentity | None = None) -> str:
    """This host's own queue for work only it can do (a local folder, a cron trigger it holds), when the
    host declared its name; an undeclared host has no queue of its own, so the work goes to `pi-jobs`."""
    host = host or this_host()
    return host_queue(host.name) if host.declared else SHARED_QUEUE
