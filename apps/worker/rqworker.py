"""The RQ worker class that plain `python manage.py rqworker pi-jobs pi-jobs@hostA` uses (settings.RQ).

What it adds to RQ's forking worker:
- it only drains pidispatch queues, and a host queue on the command line declares the host's name;
- it always runs RQ's scheduler (retries and deferrals wait in the scheduled registry), so no extra
  flag or process is needed;
- a job that returns `Deferred(until)` goes back to the scheduled registry under the same id, with no
  attempt used and no record written;
- it never logs a job's description (RQ's default would print the payload, which holds issue text).
"""

from django.core.exceptions import ImproperlyConfigured
from rq import Worker
from rq.job import JobStatus

from apps.fleet import hosts
from apps.fleet.queues import SHARED_QUEUE, host_of_queue, is_dispatch_queue

from . import tasks  # noqa: F401  preloaded: every forked work horse starts with the job code imported
from .verdicts import Deferred


class DispatchWorker(Worker):
    log_job_description = False

    def __init__(self, queues, *args, **kwargs):
        super().__init__(queues, *args, **kwargs)
        self._declare_host(self.queue_names())

    @staticmethod
    def _declare_host(queue_names: list[str]) -> None:
        foreign = [name for name in queue_names if not is_dispatch_queue(name)]
        if foreign:
            raise ImproperlyConfigured(
                f"not a pidispatch queue: {', '.join(foreign)}. Workers drain {SHARED_QUEUE} and "
                f"{SHARED_QUEUE}@<worker name>."
            )
        named = sorted({host_of_queue(name) for name in queue_names} - {None})
        if len(named) > 1:
            raise ImproperlyConfigured(
                f"one worker drains one host queue, got {', '.join(named)}: start one worker per host name."
            )
        if named:
            hosts.declare_from_queue(named[0])

    def work(self, *args, **kwargs):
        kwargs["with_scheduler"] = True
        return super().work(*args, **kwargs)

    def _finalize_success(self, job, queue, execution, return_value):
        if not isinstance(return_value, Deferred):
            return super()._finalize_success(job, queue, execution, return_value)
        self.handle_execution_ended(job, queue, job.success_callback_timeout)
        with self.connection.pipeline() as pipeline:
            queue.schedule_job(job, return_value.until, pipeline=pipeline)
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            pipeline.execute()
        job._status = JobStatus.SCHEDULED
        self.log.info("job_deferred job=%s until=%s reason=%s", job.id, return_value.until.isoformat(),
                      return_value.reason)
