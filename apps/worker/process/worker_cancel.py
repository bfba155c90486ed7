"""Cancel, the worker's half: the main process of the worker that runs a job watches for a cancel
request about once a second, acknowledges it, and stops the job's container (SIGTERM, SIGKILL after
5 s). It runs outside the work horse on purpose: RQ's own stop command SIGKILLs the horse, and a stop
that lived in the horse would die with it. The horse's ladder then records `operator-cancel`."""

from __future__ import annotations

import logging

from docker.errors import DockerException, NotFound
from redis.exceptions import RedisError
from requests import RequestException

from apps.fleet import cancel
from apps.worker.sandbox import container

logger = logging.getLogger("pidispatch.worker")


class CancelWatch:
    """Per job: not acknowledged yet -> acknowledged -> container stopped (retried until it is)."""

    def __init__(self, worker):
        self.worker = worker
        self.job_id: str | None = None
        self.acknowledged = False
        self.stopped = False

    def start(self, job_id: str) -> None:
        self.job_id, self.acknowledged, self.stopped = job_id, False, False
        self.check()

    def reset(self) -> None:
        self.job_id, self.acknowledged, self.stopped = None, False, False

    def check(self) -> None:
        """One look. Redis unreachable: the next tick looks again (a job just taken when Redis went away must
        still reach its horse, whose ladder rides out the outage; the worker must not die holding it)."""
        if not self.job_id or self.stopped:
            return
        if not self.acknowledged:
            try:
                self.acknowledged = self._acknowledge()
            except RedisError as error:
                logger.warning("job_cancel_check_failed job=%s error=%s", self.job_id, type(error).__name__)
                return
            if not self.acknowledged:
                return
            logger.info("job_cancel_acknowledged job=%s", self.job_id)
        self.stopped = self._stop_container()

    def _acknowledge(self) -> bool:
        redis = self.worker.connection
        return cancel.is_cancel_requested(self.job_id, redis) and cancel.acknowledge(redis, self.job_id,
                                                                                     self.worker.name)

    def _stop_container(self) -> bool:
        """True once the container has been stopped. Not created yet (the ladder is still climbing): the
        next tick looks again, and gate 1 or the post-exit check records the cancel."""
        name = container.container_name(self.job_id)
        try:
            found = container.engine().containers.get(name)
            found.stop(timeout=container.STOP_GRACE_SECONDS)
        except NotFound:
            return False
        except (container.EngineUnavailable, DockerException, RequestException) as exc:
            logger.warning("job_cancel_stop_failed job=%s error=%s", self.job_id, type(exc).__name__)
            return False
        logger.info("job_cancel_container_stopped job=%s container=%s", self.job_id, name)
        return True
