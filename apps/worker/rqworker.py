"""The RQ worker class that plain `python manage.py rqworker pi-jobs pi-jobs@hostA` uses (settings.RQ).

What it adds to RQ's forking worker:
- it only drains pidispatch queues, and a host queue on the command line declares the host's name;
- it always runs RQ's scheduler (retries and deferrals wait in the scheduled registry), so no extra
  flag or process is needed;
- it never logs a job's description (RQ's default would print the payload, which holds issue text).
"""

from django.core.exceptions import ImproperlyConfigured
from rq import Worker

from apps.fleet import hosts
from apps.fleet.queues import SHARED_QUEUE, host_of_queue, is_dispatch_queue


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
