"""Failed jobs: retry one now, or discard it. The fleet panel and `manage.py fleet retry|discard` call these.

A failed job's RQ copy no longer holds its texts (the issue's text, the task: jobs.py forgets them when the
job ends), so it cannot simply be requeued. "Retry now" starts a new run of the same target and flow through
manual_runs (what `dispatch_run` and the API's `POST /runs` use); the worker reads a forge issue afresh, and
a schedule's task comes from its trigger. The failed copy then leaves the failed list (its run records stay).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

from . import audit
from .cancel import is_job_id
from .queues import host_of_queue

logger = logging.getLogger("pidispatch.fleet")


@dataclass(frozen=True)
class FailedJobResult:
    job_id: str
    changed: bool
    message: str
    new_job_id: str = ""
    audit_error: str = ""


def _failed_job(redis, job_id: str) -> Job:
    if not is_job_id(job_id):
        raise ValueError(f"{job_id!r} is not a job id (letters, digits, '_' and '-')")
    try:
        job = Job.fetch(job_id, connection=redis)
    except NoSuchJobError:
        raise ValueError(f"no job {job_id} in Redis: it expired from the failed list (see the run history); "
                         "nothing was changed") from None
    if job.get_status(refresh=False) != JobStatus.FAILED:
        raise ValueError(f"job {job_id} is not failed ({job.get_status(refresh=False)}); nothing was changed")
    return job


def _remove(redis, job: Job) -> None:
    FailedJobRegistry(job.origin, connection=redis).remove(job, delete_job=True)


def discard_failed(redis, job_id: str, *, by: str) -> FailedJobResult:
    """Forget a failed job in Redis (its run records stay): the operator has seen it and will not retry it."""
    job = _failed_job(redis, job_id)
    queue = job.origin
    _remove(redis, job)
    message = f"discarded failed job {job_id} from {queue}; its run records stay in the history"
    logger.info("fleet_discard job=%s queue=%s", job_id, queue)
    return FailedJobResult(job_id, True, message, audit_error=audit.record(
        "discard", actor=by, queues=[queue], job_id=job_id, outcome=message))


def retry_arguments(spec, queue: str) -> tuple[str, dict]:
    """Which manual_runs call repeats this job, and its arguments. ValueError when it cannot be repeated."""
    execution = {"flow": spec.flow if spec.flow != "task" or spec.command else "", "command": spec.command,
                 "image": spec.image, "provider": spec.provider, "model": spec.model, "max_turns": spec.max_turns}
    if spec.kind == "local":
        task = _trigger_task(spec.trigger_id)
        if not task:
            raise ValueError(f"job {spec.job_id} was started by hand and its task is not kept after it ends: start it "
                             "again from “Start a run”; nothing was changed")
        return "local", {"folder": spec.folder, "host": host_of_queue(queue) or "", "task": task,
                         "force": spec.force, **execution}
    if spec.number is None:
        raise ValueError(f"job {spec.job_id} has no issue or pull request to run on again; nothing was changed")
    return "forge", {"forge": spec.kind, "repository": spec.repo, "number": spec.number,
                     "target_type": spec.target_type or "issue", "project_id": spec.project_id,
                     "repository_id": spec.repository_id, **execution}


def _trigger_task(trigger_id) -> str:
    if trigger_id is None:
        return ""
    from apps.receiver.models import Trigger

    trigger = Trigger.objects.filter(pk=trigger_id).only("task").first()
    return trigger.task if trigger else ""


def retry_failed(redis, job_id: str, *, by: str, user=None) -> FailedJobResult:
    """A new run of a failed job's target and flow, now; the failed copy leaves the failed list. `user` is the
    admin's user retrying it (a folder's run takes their `worker.start_folder_run`), None for `fleet retry` on a
    host."""
    from django.core.exceptions import PermissionDenied

    from apps.worker.jobs import JobSpec, JobSpecError
    from apps.worker.manual_runs import ManualRunRefused, start_forge_run, start_local_run

    job = _failed_job(redis, job_id)
    try:
        spec = JobSpec.from_payload(job.args[0])
    except (JobSpecError, IndexError, TypeError, KeyError, ValueError):
        raise ValueError(f"job {job_id} cannot be read by this version; nothing was changed") from None
    side, arguments = retry_arguments(spec, job.origin)
    try:
        if side == "local":
            folder = arguments.pop("folder")
            queued = start_local_run(folder, by=user, **arguments)
        else:
            queued = start_forge_run(arguments.pop("forge"), arguments.pop("repository"), arguments.pop("number"),
                                     **arguments)
    except ManualRunRefused as refused:
        raise ValueError(f"retry of {job_id} refused: {refused.message}") from None
    except PermissionDenied as denied:
        raise ValueError(f"retry of {job_id} refused: {denied}; nothing was changed") from None
    _remove(redis, job)
    message = f"retried failed job {job_id} as {queued.job_id} on {queued.queue}"
    logger.info("fleet_retry job=%s new_job=%s queue=%s", job_id, queued.job_id, queued.queue)
    return FailedJobResult(job_id, True, message, new_job_id=queued.job_id, audit_error=audit.record(
        "retry", actor=by, queues=[queued.queue], job_id=job_id, outcome=message))
