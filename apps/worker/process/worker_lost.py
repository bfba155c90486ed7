"""Jobs whose worker died: recorded `failed` / `worker-lost` once, run again as a new attempt when the lost-retry
policy allows it, containers and job folders reaped.

Four ways a job loses its worker, one settlement (`settle`):
- the work horse dies while its worker lives (killed, OOM): the worker stops the container itself and
  records the run (`operator-cancel` when an operator asked for it, else `worker-lost`);
- the whole worker process dies (SIGKILL) and comes back: at boot, before taking work, it removes this
  host's stray `pi-job-*` containers (by label) except those a live sibling process is running, and
  settles their jobs;
- a worker process dies for good, or its host is lost: any live worker's sweep finds the job started by a
  dead process (its PID is gone on this machine, or its registry entry expired and RQ's heartbeat with it);
- RQ's own registry cleanup finds an abandoned job: the exception handler settles it before RQ could
  retry it.

The lost-retry policy (Buildkite's automatic retry on a lost agent is the model): a lost attempt may have spent,
so whether it runs again is the operator's setting, `PI_LOST_RETRIES` (the settings row over the environment,
default 1, 0 never), counted per job across its attempts. A retry is the same job id, enqueued again on the
queue it came from as the next attempt (a host-queue job waits for its host to return; a shared-queue job goes
to any live host), and it climbs every gate again: it holds its dollar cap and takes a job-count slot anew,
while the lost attempt's open dollar hold is charged whole as spent (`floor`) and its job-count slot is kept.
A job an operator cancelled never runs again. The record of the lost attempt says what became of it
(`Run.lost_retry`). Only the settler holding the attempt's lock decides, so the record and the re-enqueue
happen once whichever way the loss is found; the re-enqueue is RQ's own `job.retry`, done here or, on the
two paths where RQ handles the failure itself (the killed horse, the abandoned job), by RQ when `settle`
leaves the job one retry.

And one way a worker lets go of its job itself: Redis has been gone longer than a running job rides out
(apps/worker/process/redis_outage.py). It stops the container and records the attempt (`give_up`), deciding its
retry from the database alone; the retry (or RQ's failure mark) follows from whichever sweep finds the job once
Redis answers.

Whatever became of its worker, a container past its deadline (its `pidispatch.deadline` label, plus the
time its worker's own stop takes) is stopped by the sweep of any worker on its host (`reap_overdue`), with
no Redis needed: nothing may run for long unwatched with its token. Both the boot reaper and that sweep
also remove the job folders (prompt, clone) that no live work horse holds (`reap_job_folders`).

Redis keys:
    pidispatch:lost:<job id>:<attempt>   STRING the RQ worker that settled this attempt (NX lock, 1 hour)
"""

from __future__ import annotations

import logging
import time
from datetime import UTC

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from docker.errors import DockerException, NotFound
from redis.exceptions import RedisError
from requests import RequestException
from rq.exceptions import AbandonedJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.queue import Queue
from rq.registry import StartedJobRegistry

from apps.fleet import registry
from apps.fleet.cancel import is_cancel_requested
from apps.fleet.connection import text
from apps.fleet.union import existing_queues
from apps.worker import accepted, run_logs
from apps.worker.forges.publishing import changes as work_changes
from apps.worker.gates import budget, money, runtime_settings
from apps.worker.gates.verdicts import Verdict
from apps.worker.jobs import JobSpec, forget_container_texts
from apps.worker.models import LostRetry, Outcome, Run
from apps.worker.records import record_lost_retry, record_run
from apps.worker.sandbox import container, jobfiles, sandboxes

logger = logging.getLogger("pidispatch.worker")

WORKER_LOST, OPERATOR_CANCEL = "worker-lost", "operator-cancel"
LOCK_SECONDS = 3600
# How long past its deadline a container may still be running before it counts as unwatched: its worker stops
# it at the deadline (SIGTERM, SIGKILL after the grace) and waits up to 30 s for the engine.
OVERDUE_SECONDS = container.STOP_GRACE_SECONDS + 60


def attempt_of(job: Job) -> int:
    return (job.number_of_retries or 0) + 1


def remove_container(job_id: str, host: str, grace: int = 0) -> bool:
    """Stop (SIGTERM, SIGKILL after `grace` s) and remove this engine's container of the job, if it is
    this host's. True when there was one."""
    try:
        client = container.engine()
        found = client.containers.get(container.container_name(job_id))
        if found.labels.get(container.HOST_LABEL) != host:
            return False
        if grace:
            found.stop(timeout=grace)
        found.remove(force=True)
        logger.info("container_reaped job=%s host=%s", job_id, host)
        return True
    except NotFound:
        return False
    except (container.EngineUnavailable, DockerException, RequestException) as exc:
        logger.warning("container_reap_failed job=%s error=%s", job_id, type(exc).__name__)
        return False


def settle(job: Job, *, host: str, settled_by: str, reason: str = WORKER_LOST, budget_reserved: bool = False,
           fail_in_rq: bool = True) -> bool:
    """Record the lost attempt (unless its record exists), charge its open dollar hold, and put the job back as
    its next attempt when the policy says so, else end it. Once per attempt: False for every settler but the
    first. `fail_in_rq`: this settler writes RQ's end of the attempt; otherwise RQ does (the killed horse's
    failure handling, the abandoned-job cleanup), retrying the job when this leaves it one retry."""
    redis = job.connection
    attempt = attempt_of(job)
    job.retries_left = 0  # whatever ends it from here, RQ runs it again only if this settler says so
    if not redis.set(f"pidispatch:lost:{job.id}:{attempt}", settled_by, nx=True, ex=LOCK_SECONDS):
        return False
    if reason == WORKER_LOST and is_cancel_requested(job.id, redis):
        reason = OPERATOR_CANCEL
    dollars = _charge_hold(job)  # before any next attempt, which holds its own under the same job id
    decision = _record(job, attempt, host=host, reason=reason, budget_reserved=budget_reserved, dollars=dollars)
    retried = decision == LostRetry.RETRIED
    if retried:
        job.number_of_retries = attempt  # RQ counts attempts from it: the next one is attempt + 1
        job.retries_left = 1
    else:
        forget_container_texts(job)  # the failure write below, or RQ's own after this, stores the job without them
        accepted.settle(job.id)
    if fail_in_rq:
        with redis.pipeline() as pipe:
            forget_executions(job, pipe)
            if retried:
                job.retry(Queue(job.origin, connection=redis), pipe)
            else:
                record_job_failure(job, f"{reason}: the worker running this job died", pipe)
            pipe.execute()
    logger.warning("job_lost job=%s attempt=%s host=%s reason=%s lost_retry=%s", job.id, attempt, host, reason,
                   decision or "-")
    if retried:
        logger.info("job_lost_retried job=%s attempt=%s queue=%s", job.id, attempt + 1, job.origin)
    return True


def forget_executions(job: Job, pipe) -> None:
    """RQ's StartedJobRegistry.remove_executions, by the execution ids alone: RQ's reads each execution's record
    first, and one that expired while its worker was cut off from Redis raises instead of being removed (a host
    back from a two-minute cut met it: the sweeping worker died)."""
    registry = StartedJobRegistry(job.origin, connection=job.connection, job_class=type(job))
    execution_ids = job.execution_registry.get_execution_ids()
    if execution_ids:
        pipe.zrem(registry.key, *(f"{job.id}:{execution_id}" for execution_id in execution_ids))


def retry_decision(job_id: str, attempt: int, reason: str) -> str:
    """Whether a lost attempt runs again (LostRetry): never after an operator's cancel, nor with the policy off,
    nor once the job's lost-worker retries are used up."""
    if reason == OPERATOR_CANCEL:
        return LostRetry.CANCELLED
    allowed = runtime_settings.live_lost_retries()
    if allowed == 0:
        return LostRetry.OFF
    if Run.objects.lost_retries(job_id, before=attempt) >= allowed:
        return LostRetry.USED_UP
    return LostRetry.RETRIED


def _record(job: Job, attempt: int, *, host: str, reason: str, budget_reserved: bool, dollars: dict) -> str:
    """The attempt's record and what becomes of the job: RETRIED only when the record says it runs again."""
    try:
        spec = JobSpec.from_payload(job.args[0])
    except Exception:  # any unreadable payload (JobSpecError, a missing or foreign argument)
        logger.error("job_lost_unrecorded job=%s why=payload-unreadable", job.id)
        return ""
    try:
        existing = Run.objects.filter(job_id=job.id, attempt=attempt).first()
        if existing is not None:
            # The horse wrote its verdict before it died (that record is the truth and says nothing of a retry),
            # or the worker that gave the job up wrote this one and decided its retry.
            if existing.lost_retry == LostRetry.RETRIED and reason == OPERATOR_CANCEL:
                record_lost_retry(existing, LostRetry.CANCELLED)
            return existing.lost_retry
        outcome = (Verdict.refused(reason) if reason == OPERATOR_CANCEL
                   else Verdict(outcome=Outcome.FAILED, reason=reason))
        started = job.started_at or timezone.now()
        verdict = Verdict(outcome=outcome.outcome, reason=reason, budget_reserved=budget_reserved,
                          started_at=started if started.tzinfo else started.replace(tzinfo=UTC),
                          ended_at=timezone.now(), dollars=dollars,
                          lost_retry=retry_decision(job.id, attempt, reason))
        # Another settler's record may have won the race: its decision stands.
        return record_run(spec, verdict, attempt=attempt, host=host, queue=job.origin).lost_retry
    except DatabaseError as exc:
        logger.error("job_lost_unrecorded job=%s why=database-%s", job.id, type(exc).__name__)
        return ""  # without its record the job is not run again: the count of its retries is the records


def _charge_hold(job: Job) -> dict:
    """The lost attempt's open dollar hold, charged whole (it may have spent all of it), as its record's fields."""
    try:
        held = budget.charge_lost_hold(job.connection, job.id)
    except RedisError:
        return {}
    if held is None:
        return {}
    amount = money.to_usd(held)
    return {"dollars_reserved": amount, "dollars_charged": amount, "dollar_basis": budget.FLOOR}


# --- the horse died, the worker lives ------------------------------------------------------------------

def horse_lost(worker, job: Job, *, stopped_by_operator: bool) -> None:
    """Called in the worker's main process: the container must stop without any code of the dead horse."""
    host = worker.presence.host.name
    had_container = remove_container(job.id, host, grace=container.STOP_GRACE_SECONDS)
    reason = OPERATOR_CANCEL if stopped_by_operator or is_cancel_requested(job.id, job.connection) else WORKER_LOST
    settle(job, host=host, settled_by=worker.name, reason=reason, budget_reserved=had_container, fail_in_rq=False)


def abandoned_job_handler(job: Job, exc_type, exc_value, traceback):
    """RQ's registry cleanup found a started job whose heartbeat stopped: settle it before RQ can retry it."""
    if exc_type is not AbandonedJobError:
        return None  # noqa: RET501 (an RQ exception handler: None lets the next handler run)
    host = job.worker_name or ""
    process = registry.read_process(job.connection, job.worker_name) if job.worker_name else None
    # Leaves the job one retry when it runs again: RQ's cleanup then puts it back itself (`job.retry`).
    settle(job, host=process.host if process else host, settled_by="rq-cleanup", fail_in_rq=False)
    return None  # noqa: RET501 (and RQ's own handling goes on)


def give_up(worker, job: Job) -> None:
    """Called in the worker's main process once its horse is dead and Redis still does not answer: the
    container is stopped, and the attempt recorded, its retry decided, from the database alone (`settle` finds
    the record once Redis is back, and carries the decision out or marks the job failed in RQ)."""
    host = worker.presence.host.name
    had_container = remove_container(job.id, host, grace=container.STOP_GRACE_SECONDS)
    _record(job, attempt_of(job), host=host, reason=WORKER_LOST, budget_reserved=had_container, dollars={})


# --- the whole worker died ----------------------------------------------------------------------------

def live_sibling_jobs(worker) -> set[str]:
    """Job ids that live worker processes of this host (other than this one) are running."""
    host = worker.presence.host.name
    redis = worker.connection
    running = set()
    for worker_name in redis.smembers(registry.host_workers_key(host)):
        worker_name = text(worker_name)
        if worker_name == worker.name:
            continue
        process = registry.read_process(redis, worker_name)
        if process and process.job and registry.process_alive(process):
            running.add(process.job.job_id)
    return running


def reap_strays(worker) -> None:
    """At boot, before taking work: this host's `pi-job-*` containers that no live sibling runs, then the
    job folders that no live work horse holds."""
    _reap_stray_containers(worker)
    if sandboxes.remove_ended():
        logger.info("sandbox_containers_reaped why=boot")
    reap_job_folders()


def reap_job_folders() -> None:
    """Job folders under PI_JOB_ROOT whose work horse is gone: the prompt (issue text) and the clone go with
    it (apps/worker/sandbox/jobfiles.py says what is held, and what KEEP_UNTIL keeps). PI_KEEP_JOB_DIRS keeps all."""
    if settings.PI_KEEP_JOB_DIRS:
        return
    for job_id in jobfiles.remove_unheld(settings.PI_JOB_ROOT, timezone.now(), in_use=sandboxes.in_use):
        logger.info("job_folder_reaped job=%s", job_id)


def _reap_stray_containers(worker) -> None:
    host = worker.presence.host.name
    strays = _job_containers(host, skipped="boot_reaper_skipped")
    if not strays:
        return
    keep = live_sibling_jobs(worker)  # read after the listing: a sibling registers a job before its container
    for stray in strays:
        job_id = stray.labels.get(container.JOB_LABEL, "")
        if job_id in keep:
            logger.info("boot_reaper_kept job=%s why=live-sibling", job_id)
            continue
        if not _remove_listed(stray, job_id):
            continue
        logger.info("container_reaped job=%s host=%s why=boot", job_id, host)
        job = _fetch(worker.connection, job_id)
        if job and job.get_status(refresh=False) == JobStatus.STARTED:
            settle(job, host=host, settled_by=worker.name, budget_reserved=True)


def _fetch(redis, job_id: str) -> Job | None:
    try:
        return Job.fetch(job_id, connection=redis)
    except NoSuchJobError:
        return None


def _job_containers(host: str, *, skipped: str, labels: tuple[str, ...] = ()) -> list:
    """This host's `pi-job-*` containers (that carry `labels` too); none, logged as `skipped`, when the engine
    does not answer."""
    try:
        found = container.engine().containers.list(
            all=True, filters={"label": [f"{container.HOST_LABEL}={host}", *labels]},
            ignore_removed=True)  # a sibling may remove one as we list
    except (container.EngineUnavailable, DockerException, RequestException) as exc:
        logger.warning("%s host=%s error=%s", skipped, host, type(exc).__name__)
        return []
    return [c for c in found if c.name.startswith(container.CONTAINER_PREFIX)]


def _remove_listed(found, job_id: str) -> bool:
    """Remove a container found in a listing, running or not. False when it was gone or would not go."""
    try:
        found.remove(force=True)
    except NotFound:
        return False
    except (DockerException, RequestException) as exc:
        logger.warning("container_reap_failed job=%s error=%s", job_id, type(exc).__name__)
        return False
    return True


def reap_overdue(host: str) -> None:
    """This host's job containers that are past their deadline: stopped and removed, whoever runs them."""
    now = time.time()
    for found in _job_containers(host, skipped="overdue_reaper_skipped", labels=(container.DEADLINE_LABEL,)):
        job_id = found.labels.get(container.JOB_LABEL, "")
        try:
            deadline = int(found.labels[container.DEADLINE_LABEL])
        except ValueError:
            continue  # not a label this worker wrote
        if now > deadline + OVERDUE_SECONDS and _remove_listed(found, job_id):
            logger.warning("container_reaped job=%s host=%s why=overdue overdue_seconds=%d", job_id, host,
                           now - deadline)


def sweep(worker) -> None:
    """Every beat: containers past their deadline and job folders no live work horse holds on this host,
    and jobs started by a worker process that is gone, in any queue of the fleet."""
    reap_overdue(worker.presence.host.name)
    reap_job_folders()
    run_logs.sweep()  # logs past PI_JOB_LOG_RETENTION_DAYS, beside the job folders
    work_changes.sweep()  # the runs' diffs, kept as long as their logs
    redis = worker.connection
    try:
        queues = existing_queues(redis) | set(worker.queue_names())
        now = time.time()
        for queue in sorted(queues):
            started = StartedJobRegistry(queue, connection=redis)
            for member, score in redis.zrange(started.key, 0, -1, withscores=True):
                job_id = started.parse_job_id(member)
                job = _fetch(redis, job_id)
                if not job or job.get_status(refresh=False) != JobStatus.STARTED or not job.worker_name:
                    continue
                process = registry.read_process(redis, job.worker_name)
                if process is not None and registry.process_alive(process):
                    continue
                if process is None and score > now:
                    continue  # no entry but RQ's heartbeat still runs: an entry write failed, not a death
                host = process.host if process else worker.presence.host.name
                had_container = remove_container(job_id, worker.presence.host.name)
                settle(job, host=host, settled_by=worker.name, budget_reserved=had_container)
    except RedisError as exc:
        logger.warning("lost_job_sweep_failed error=%s", type(exc).__name__)
