"""The RQ worker class that plain `python manage.py rqworker pi-jobs pi-jobs@hostA` uses (settings.RQ),
and django-rq's `rqworker-pool` for N processes on one host.

What it adds to RQ's forking worker:
- it only drains pidispatch queues, and a host queue on the command line declares the host's name;
- it does not start on a git older than the releases fixed against lazy fetching (the worker's git runs in
  repositories the agent wrote: apps/worker/sandbox/gitrun.py);
- it always runs RQ's scheduler (retries and deferrals wait in the scheduled registry), so no extra
  flag or process is needed;
- it publishes its process in the host registry, and at boot, before taking work, removes this host's
  stray job containers that no live sibling process runs (apps/worker/process/worker_lost.py);
- once a UTC day across the fleet, one worker runs the housekeeping beside itself
  (apps/worker/process/worker_housekeeping.py);
- it honours per-queue pause flags: a paused queue is skipped within about a second while the others
  keep draining, and a running job finishes;
- a job that returns `Deferred(until, reason, detail)` goes back to the scheduled registry under the same
  id, with no attempt used and no record written, and a note says why it waits (apps/fleet/waiting.py);
- while a job runs, its main process watches for a cancel request and stops the container itself
  (apps/worker/process/worker_cancel.py); a cancelled job is never retried;
- a job whose work horse or whole worker died is recorded `worker-lost` once, and run again as its next attempt
  only as the lost-retry policy says (apps/worker/process/worker_lost.py);
- a Redis outage while a job runs is ridden out for PI_REDIS_OUTAGE_SECONDS (apps/worker/process/redis_outage.py):
  heartbeats that fail are noted, not fatal, and past that the job is given up, its container stopped;
- it never logs a job's description or arguments (RQ's defaults would print the payload or attach it to
  the log record of a job that raised: it holds issue text);
- once a job has ended, whatever its end (finished, refused, failed, stopped, lost), the copy RQ keeps of
  it holds none of its texts (apps/worker/jobs.py, forget_container_texts); a deferred or retried job
  keeps them until its last attempt ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Worker
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import DequeueTimeout
from rq.job import JobStatus
from rq.job_lifecycle import call_exception_handlers, format_exc_info
from rq.scheduler import RQScheduler
from rq.worker.base import WorkerStatus

from apps.fleet import drains, hosts, pauses, state, waiting
from apps.fleet.cancel import is_cancel_requested
from apps.fleet.connection import text
from apps.fleet.queues import SHARED_QUEUE, host_of_queue, is_dispatch_queue
from apps.fleet.union import register_queues
from apps.worker import accepted
from apps.worker.gates import host_budget, ladder
from apps.worker.gates.verdicts import Deferred
from apps.worker.jobs import forget_container_texts
from apps.worker.process import redis_outage, worker_lost
from apps.worker.process.worker_cancel import CancelWatch
from apps.worker.process.worker_housekeeping import DailyHousekeeping
from apps.worker.process.worker_presence import Presence, job_target
from apps.worker.sandbox.gitrun import require_safe_git

logger = logging.getLogger("pidispatch.worker")

# How often an idle worker looks at pause flags and a busy one at cancel requests (issue: about a second).
TICK_SECONDS = 1
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: this child process is SIGKILLed when its parent dies, so a SIGKILLed worker leaves no work
    horse running a job unwatched and no scheduler promoting jobs behind a dead worker's back."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class DispatchScheduler(RQScheduler):
    def work(self):
        """RQ's, which a Redis error would end: retries and deferrals would then wait for the worker's next
        maintenance (minutes) to start another. It starts over once Redis answers."""
        die_with_parent()
        outage = redis_outage.Outage()
        while True:
            try:
                return super().work()
            except RedisError as error:
                outage.failed(error)
            while not self._stop_requested and not redis_outage.answers(self.connection):
                time.sleep(self.interval)
            if self._stop_requested:
                return None  # its locks expire on their own
            outage.answered()


class DispatchWorker(Worker):
    log_job_description = False

    def __init__(self, queues, *args, **kwargs):
        kwargs.setdefault("job_monitoring_interval", TICK_SECONDS)
        super().__init__(queues, *args, **kwargs)
        self._declare_host(self.queue_names())
        budget = host_budget.budget_at_start()  # a budget below one default job refuses the start, saying why
        self.presence = Presence(self, host_budget.registry_fields(budget))
        self.cancel_watch = CancelWatch(self)
        self.housekeeping = DailyHousekeeping(self)
        self.push_exc_handler(worker_lost.abandoned_job_handler)
        self.redis_outage = redis_outage.Outage()
        self._next_beat = 0.0
        self._paused: set[str] = set()
        self._drained = False
        self._deferred_since: float | None = None

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

    # --- boot and shutdown ----------------------------------------------------------------------------

    def work(self, *args, **kwargs):
        require_safe_git()
        kwargs["with_scheduler"] = True
        self.housekeeping.burst = bool(kwargs.get("burst", args[0] if args else False))
        register_queues(self.connection, self.queue_names())
        self.presence.beat()
        worker_lost.reap_strays(self)
        host_budget.list_at_start(self.connection, self.presence.host.name)  # nothing is admitted before
        self._reconcile_accepted_jobs()
        ladder.warm_up()
        connections.close_all()  # the reaper may have written records; a forked horse must not share them
        try:
            return super().work(*args, **kwargs)
        finally:
            self.presence.withdraw()

    def _start_scheduler(self, burst=False, logging_level="INFO", date_format=DEFAULT_LOGGING_DATE_FORMAT,
                         log_format=DEFAULT_LOGGING_FORMAT):
        """RQ's, with a scheduler process that dies with this worker."""
        self.scheduler = DispatchScheduler(
            self.queues, connection=self.connection, serializer=self.serializer, date_format=date_format,
            log_format=log_format, logging_level=logging_level if logging_level is not None else self.log.level,
        )
        self.scheduler.acquire_locks()
        if not self.scheduler.acquired_locks:
            return
        if burst:
            try:
                self.scheduler.register_birth()
                self.scheduler.enqueue_scheduled_jobs()
            finally:
                self.scheduler.release_locks()
                self.scheduler.register_death()
        else:
            self.scheduler.start()

    def teardown(self):
        try:
            super().teardown()
        except RedisError as error:  # the worker's RQ key expires on its own
            logger.warning("worker_death_unregistered error=%s", type(error).__name__)

    def pulse(self) -> None:
        """Every beat: the registry row, RQ's own heartbeat, the sweep for jobs of dead workers, and the daily
        housekeeping when it is due (run beside the worker)."""
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + settings.PI_FLEET_BEAT_SECONDS
        self.presence.beat()
        self.heartbeat()
        worker_lost.sweep(self)
        self.housekeeping.tick()
        connections.close_all()

    # --- Redis outages: noted, ridden out while a job runs (apps/worker/process/redis_outage.py) ---------------

    def heartbeat(self, timeout=None, pipeline=None):
        """RQ's. Outside a pipeline a failure is noted, not raised: a worker that cannot beat is not dead."""
        if pipeline is not None:
            return super().heartbeat(timeout, pipeline)
        with self.redis_outage.noted():
            super().heartbeat(timeout)

    def set_state(self, state, pipeline=None):
        if pipeline is not None:
            return super().set_state(state, pipeline)
        with self.redis_outage.noted():
            super().set_state(state)

    def check_for_suspension(self, burst):
        with self.redis_outage.noted():  # the dequeue that follows waits for Redis
            super().check_for_suspension(burst)

    def run_maintenance_tasks(self):
        with self.redis_outage.noted():  # due again on the next turn of the loop
            super().run_maintenance_tasks()

    def get_heartbeat_ttl(self, job, working_time=0.0):
        """RQ's (60 s past the next beat), stretched over the outage a running job rides out, so that no other
        worker's cleanup takes the job for abandoned before this one gives it up."""
        return max(super().get_heartbeat_ttl(job, working_time),
                   self.job_monitoring_interval + settings.PI_REDIS_OUTAGE_SECONDS + 10)

    def handle_execution_ended(self, job, queue, heartbeat_ttl):
        """In the horse, once the job has ended (and been recorded): RQ writes its result next."""
        redis_outage.wait_until_answered(self.connection, settings.PI_REDIS_OUTAGE_SECONDS)
        super().handle_execution_ended(job, queue, heartbeat_ttl)

    def _give_up(self, job, error: RedisError):
        """Redis has been gone longer than a job rides out: the job ends here rather than run unwatched."""
        logger.error("job_given_up job=%s why=redis-unavailable after_seconds=%.0f", job.id,
                     self.redis_outage.seconds())
        self.kill_horse()
        self.wait_for_horse()
        worker_lost.give_up(self, job)
        raise error

    # --- taking work: skip paused queues, take nothing on a drained host ------------------------------------------

    def _active_queues(self):
        try:
            # A Redis that lost its data gets the recorded pauses and drains back before anything is taken, and
            # the accepted jobs it lost queued again.
            if state.ensure_restored(self.connection):
                self._reconcile_accepted_jobs()
            paused = pauses.paused_among(self.connection, self.queue_names())
            drained = drains.is_drained(self.connection, hosts.this_host().name)
        except state.StateUnknown:
            return []  # which queues are paused cannot be told: take nothing until the record can be read
        except RedisError:
            paused, drained = self._paused, self._drained  # keep the last known answer through a blip
        for name in sorted(paused ^ self._paused):
            logger.info("queue_%s queue=%s", "paused" if name in paused else "resumed", name)
        if drained != self._drained:
            logger.info("host_%s host=%s", "drained" if drained else "undrained", hosts.this_host().name)
            self.presence.drain_changed(drained)
        self._paused, self._drained = paused, drained
        if drained:
            return []  # this host takes nothing from any queue; the rest of the fleet goes on
        return [queue for queue in self._ordered_queues if queue.name not in paused]

    def _reconcile_accepted_jobs(self) -> None:
        """accepted.reconcile against a Redis not reconciled with yet (the replayer does it too; either may be first,
        the job ids keep it once). Whatever fails is tried again by the replayer's next pass."""
        try:
            accepted.reconcile_if_redis_changed(self.connection)
        except (DatabaseError, RedisError) as error:
            logger.warning("accepted_jobs_unreconciled error=%s", type(error).__name__)
        finally:
            connections.close_all()  # a forked horse must never share the main process's database socket

    def _pop(self, queues, timeout):
        if len(queues) == 1 and len(self.queues) > 1:
            # RQ's single-queue pop parks the id in an intermediate list that only a single-queue worker
            # clears; a worker of several queues, one of them paused, must pop the way it always does.
            result = self.queue_class.lpop([queues[0].key], timeout, connection=self.connection)
            if result is None:
                return None
            queue_key, job_id = (text(value) for value in result)
            found = self.queue_class._fetch_dequeued_job(self.connection, queue_key, job_id, job_class=self.job_class,
                                                         serializer=self.serializer,
                                                         death_penalty_class=self.death_penalty_class)
            return found if found is not None else self._pop(queues, timeout)
        return self.queue_class.dequeue_any(queues, timeout, connection=self.connection, job_class=self.job_class,
                                            serializer=self.serializer, death_penalty_class=self.death_penalty_class)

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """RQ's dequeue, in one-second slices so pause flags are honoured within about a second."""
        self.set_state(WorkerStatus.IDLE)
        self.procline("Listening on " + ",".join(self.queue_names()))
        idle_since = time.monotonic()
        connection_wait = 1.0
        while True:
            try:
                self.pulse()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                active = self._active_queues()
                if timeout is None:  # burst: take what is there now from the queues not paused, then stop
                    result = self._pop(active, None) if active else None
                elif max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                    return None
                elif not active:
                    time.sleep(TICK_SECONDS)
                    continue
                else:
                    result = self._pop(active, TICK_SECONDS)
                if result is not None:
                    job, queue = result
                    self.reorder_queues(reference_queue=queue)
                    job.redis_server_version = self.get_redis_server_version()
                    self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
                    self.heartbeat()
                return result
            except DequeueTimeout:
                continue
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self.log.error("Worker %s: could not reach Redis (%s); retrying in %d s", self.name,
                               type(exc).__name__, connection_wait)
                time.sleep(connection_wait)
                connection_wait = min(connection_wait * self.exponential_backoff_factor, self.max_connection_wait_time)

    # --- running a job ---------------------------------------------------------------------------------

    def execute_job(self, job, queue):
        # The job has left its queue and is in no registry until its horse starts: nothing here may raise, or
        # the worker dies holding it and nobody knows it was taken. Redis gone: the horse's ladder rides it out.
        try:
            self._deferred_since = waiting.take(self.connection, job.id)
        except RedisError as error:
            self._deferred_since = None
            logger.warning("job_wait_note_unread job=%s error=%s", job.id, type(error).__name__)
        self.presence.job_started(job, queue.name)
        self.cancel_watch.start(job.id)
        try:
            super().execute_job(job, queue)
        finally:
            self.cancel_watch.reset()
            self.presence.job_ended()
            connections.close_all()

    def fork_work_horse(self, job, queue):
        connections.close_all()  # a forked horse must never share the main process's database socket
        super().fork_work_horse(job, queue)

    def main_work_horse(self, job, queue):
        """The horse dies with its worker: the container it started is then reaped and the job recorded
        `worker-lost` by the worker's next incarnation or a live sibling."""
        die_with_parent()
        if os.getppid() != self.pid:
            os._exit(1)  # the worker died while the horse was being born
        return super().main_work_horse(job, queue)

    def maintain_heartbeats(self, job, execution):
        """Every tick while the horse works: RQ's heartbeats, the cancel watch, the registry beat."""
        try:
            super().maintain_heartbeats(job, execution)
        except RedisError as error:
            self.redis_outage.failed(error)
            if self.redis_outage.outlasted():
                self._give_up(job, error)
        else:
            self.redis_outage.answered()
            self.cancel_watch.check()
        self.pulse()

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        worker_lost.horse_lost(self, job, stopped_by_operator=False)

    def _handle_stopped_job(self, job, queue, execution):
        """RQ's stop-job command SIGKILLed the horse: the container is stopped from here."""
        worker_lost.horse_lost(self, job, stopped_by_operator=True)
        super()._handle_stopped_job(job, queue, execution)

    def handle_job_retry(self, job, queue, retry, started_job_registry, execution):
        if is_cancel_requested(job.id, self.connection):
            job.number_of_retries = max(retry.max, 1)  # RQ's "retries exhausted" path: failed, not re-run
            logger.info("job_not_retried job=%s why=operator-cancel", job.id)
        if job.number_of_retries and job.number_of_retries >= retry.max:  # RQ's test: this attempt was the last
            forget_container_texts(job)
        return super().handle_job_retry(job, queue, retry, started_job_registry, execution)

    def handle_job_success(self, job, queue, started_job_registry, execution):
        forget_container_texts(job)  # RQ's success write stores the job as it is in memory
        return super().handle_job_success(job, queue, started_job_registry, execution)

    def handle_job_failure(self, job, queue, started_job_registry=None, exc_string="", execution=None):
        """A job that raised, timed out, lost its horse or was stopped: RQ's failure write stores it."""
        if not job.should_retry or self._stopped_job_id == job.id:
            forget_container_texts(job)
        return super().handle_job_failure(job, queue, started_job_registry, exc_string, execution)

    def handle_exception(self, job, *exc_info):
        """RQ's, without the job's function, arguments and kwargs on the log record: ids only."""
        self.log.error("Worker %s: job %s: exception raised while executing\n%s", self.name, job.id,
                       format_exc_info(exc_info), extra={"queue": job.origin, "job_id": job.id})
        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def clean_registries(self):
        worker_lost.sweep(self)  # before RQ's cleanup, which would retry a lost job that has retries left
        super().clean_registries()

    def _finalize_success(self, job, queue, execution, return_value):
        if not isinstance(return_value, Deferred):
            return super()._finalize_success(job, queue, execution, return_value)
        self.handle_execution_ended(job, queue, job.success_callback_timeout)
        with self.connection.pipeline() as pipeline:
            queue.schedule_job(job, return_value.until, pipeline=pipeline)
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            pipeline.execute()
        job._status = JobStatus.SCHEDULED
        try:
            waiting.note(self.connection, job.id, queue=queue.name, reason=return_value.reason,
                         until=return_value.until, detail=return_value.detail, target=job_target(job),
                         since=self._deferred_since)
        except RedisError:
            logger.warning("job_wait_note_failed job=%s", job.id)
        self.log.info("job_deferred job=%s until=%s reason=%s", job.id, return_value.until.isoformat(),
                      return_value.reason)
