"""A worker process's presence in the host registry: published at boot, on every job start and end,
and every PI_FLEET_BEAT_SECONDS (with the host's cap as it applies now, so the panel follows an edit in
the admin within a beat); withdrawn on a clean shutdown (the keys are described in apps/fleet/registry.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import replace

from django.conf import settings
from redis.exceptions import RedisError

from apps.fleet import registry
from apps.fleet.capabilities import declared_capabilities
from apps.fleet.hosts import code_version, this_host
from apps.worker.gates import runtime_settings
from apps.worker.jobs import JobSpec, JobSpecError

logger = logging.getLogger("pidispatch.worker")


def job_target(job) -> str:
    """The job's PII-free target (`owner/repo#7`, `local:<folder name>`), or "" when unreadable."""
    try:
        return JobSpec.from_payload(job.args[0]).target
    except (JobSpecError, IndexError, TypeError, ValueError, Exception):
        return ""


class Presence:
    def __init__(self, worker, budget: dict[str, str] | None = None):
        host = this_host()
        self.redis = worker.connection
        self.host = registry.HostFacts(
            name=host.name, declared=host.declared, version=code_version(), image=settings.PI_JOB_IMAGE,
            capabilities=tuple(declared_capabilities(settings)),  # a malformed profile setting refuses to start
            **(budget or {}),
        )
        self.worker_name = worker.name
        self.queues = tuple(worker.queue_names())
        self.started_at = time.time()
        self.job: registry.RunningJob | None = None
        self.drain_seen = False
        self._reachable = True

    def process(self) -> registry.ProcessFacts:
        return registry.ProcessFacts(worker_name=self.worker_name, pid=os.getpid(), proc=registry.process_identity(),
                                     started_at=self.started_at, queues=self.queues, job=self.job,
                                     drain_seen=self.drain_seen)

    def beat(self) -> None:
        """Never raises: a Redis blip must not stop the worker (the next beat repairs the row)."""
        self.host = replace(self.host, concurrency=runtime_settings.live_concurrency())  # the admin may change it
        try:
            registry.publish(self.redis, self.host, self.process())
        except RedisError as exc:
            if self._reachable:
                logger.warning("host_registry_unreachable host=%s error=%s", self.host.name, type(exc).__name__)
            self._reachable = False
            return
        if not self._reachable:
            logger.info("host_registry_restored host=%s", self.host.name)
        self._reachable = True

    def job_started(self, job, queue_name: str) -> None:
        self.job = registry.RunningJob(job_id=job.id, started_at=time.time(), target=job_target(job), queue=queue_name)
        self.beat()

    def drain_changed(self, drained: bool) -> None:
        """Said at once, before the worker takes another job: `fleet drain --wait` calls the host idle only once each
        of its workers has said it saw the drain (apps/fleet/drains.py), so a job taken just before can't be missed."""
        self.drain_seen = drained
        self.beat()

    def job_ended(self) -> None:
        self.job = None
        self.beat()

    def withdraw(self) -> None:
        with contextlib.suppress(RedisError):  # the entry expires on its own
            registry.withdraw(self.redis, self.host.name, self.worker_name)
