"""The failure hook (PI_ON_FAILURE): an operator's executable, run on the worker host once per job that failed for
good or was stopped after it spent, to page someone.

    <PI_ON_FAILURE> <job id> <outcome> <reason> <host>     and on stdin: the run as a JSON document

It fires for the job's final infrastructure failure (its last retry, or a lost worker's attempt not run again), and
for a stop after the container started: `worker-abort`, an in-container policy stop (`runner-policy` or the
runner's own reason), `oom-killed`, a stop by the egress gateway (`cost-cap`, `egress-denied`, ...). Never for a
completed run (a publish refusal included), a refusal before the container, an attempt that will be retried, or an
operator's cancel.

Where it hooks in: `on_run_recorded`, a receiver of `apps.worker.records.run_recorded`, so every run record passes
once. It runs as every host script does (apps/worker/gates/hostscripts.py: argv, no shell, a closed environment,
its own session), for at most PI_ON_FAILURE_TIMEOUT_MS (then SIGTERM, SIGKILL 2 s later); its exit code is logged
(`failure_hook_ran`) and otherwise ignored. A Redis key taken before it runs makes it once per job whoever records
the run (the job's work horse, or the worker settling a lost one). The document holds ids, names and numbers only:
never issue text, a title, a login or a secret.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis
from apps.worker.forges.comments import is_final
from apps.worker.models import LostRetry, Outcome, Run

logger = logging.getLogger("pidispatch.failure_hook")

FIRED_KEY = "pidispatch:on-failure:{job_id}"
FIRED_TTL_SECONDS = 30 * 24 * 3600


def pages_for(run: Run) -> bool:
    """Does this run record call for the hook?"""
    if run.outcome == Outcome.COMPLETED or run.lost_retry == LostRetry.CANCELLED or not is_final(run):
        return False
    if run.outcome == Outcome.FAILED:
        return True
    # A policy end pages only once the container ran and spent: not a refusal before it (no exit code), not a
    # completed run whose publishing was refused (exit 0), not the operator's own cancel.
    return run.budget_reserved and run.exit_code not in (None, 0) and run.reason != "operator-cancel"


def run_link(run: Run) -> str | None:
    base = settings.PI_PUBLIC_URL.rstrip("/")
    return f"{base}/admin/worker/run/{run.pk}/change/" if base else None


def document(run: Run) -> dict:
    """What the hook reads on stdin (and what a notification carries): ids, names and numbers only."""
    return {
        "jobId": run.job_id,
        "attempt": run.attempt,
        "outcome": run.outcome,
        "reason": run.reason or None,
        "host": run.host or None,
        "kind": run.kind,
        "target": run.target or None,
        "flow": run.flow or None,
        "command": run.command or None,
        "triggerId": run.trigger_id,
        "triggerType": run.trigger_type or None,
        "exitCode": run.exit_code,
        "parentJobId": run.parent_job_id or None,
        "startedAt": run.started_at.isoformat(),
        "endedAt": run.ended_at.isoformat(),
        "runUrl": run_link(run),
    }


def _first_time(job_id: str) -> bool:
    try:
        return bool(get_redis().set(FIRED_KEY.format(job_id=job_id), "1", nx=True, ex=FIRED_TTL_SECONDS))
    except RedisError:
        logger.warning("failure_hook_once_unknown job=%s why=redis-unavailable", job_id)
        return True  # rather paged twice than never


def fire(run: Run) -> None:
    """Run the hook for this record, if one is configured and it has not run for this job yet. Never raises."""
    from apps.worker.gates.hostscripts import run_script

    hook = settings.PI_ON_FAILURE
    if not hook or not pages_for(run) or not _first_time(run.job_id):
        return
    argv = [hook, run.job_id, run.outcome, run.reason or "-", run.host or "-"]
    stdin = (json.dumps(document(run)) + "\n").encode()
    try:
        answer = run_script(argv, timeout_seconds=settings.PI_ON_FAILURE_TIMEOUT_MS / 1000, stdin=stdin)
    except Exception as error:  # the hook must never change the job's outcome
        logger.warning("failure_hook_failed job=%s why=%s", run.job_id, type(error).__name__)
        return
    logger.info("failure_hook_ran job=%s outcome=%s reason=%s result=%s", run.job_id, run.outcome,
                run.reason or "-", answer.fault)


def on_run_recorded(sender, run: Run, spec, **kwargs) -> None:
    """`apps.worker.records.run_recorded` receiver."""
    fire(run)

