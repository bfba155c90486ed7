"""The one place a Run row is written."""

import logging

from django.dispatch import Signal

from .jobs import JobSpec
from django.utils import timezone

from .models import Outcome, Run
from .verdicts import Verdict

logger = logging.getLogger("pidispatch.runs")

# Sent after a run record is written (kwargs: run, spec). The receiver disarms spent one-shot rules on it.
run_recorded = Signal()


def record_run(spec: JobSpec, verdict: Verdict, *, attempt: int, host: str, queue: str) -> Run:
    telemetry = verdict.telemetry
    run, _ = Run.objects.update_or_create(
        job_id=spec.job_id,
        attempt=attempt,
        defaults=dict(
            kind=spec.kind,
            target=spec.target,
            scope=spec.scope,
            flow=spec.flow,
            command=spec.command,
            trigger_id=spec.trigger_id,
            trigger_type=spec.trigger_type,
            delivery_id=spec.delivery_id,
            host=host,
            queue=queue,
            image=verdict.image,
            started_at=verdict.started_at,
            ended_at=verdict.ended_at,
            outcome=verdict.outcome,
            reason=verdict.reason,
            exit_code=verdict.exit_code,
            turns=telemetry.turns,
            tokens_in=telemetry.tokens_in,
            tokens_out=telemetry.tokens_out,
            tokens_total=telemetry.tokens_total,
            cost=telemetry.cost,
            usage=telemetry.usage,
            budget_reserved=verdict.budget_reserved,
            replica=spec.replica,
            replicas=spec.replicas,
            parent_job_id=spec.parent_job_id,
        ),
    )
    logger.info(
        "run_recorded job=%s attempt=%s outcome=%s reason=%s exit=%s",
        spec.job_id, attempt, verdict.outcome, verdict.reason or "-", verdict.exit_code,
    )
    run_recorded.send(sender=Run, run=run, spec=spec)
    return run


def record_unreadable_job(job_id: str, *, attempt: int, host: str, queue: str) -> Run:
    """A job whose payload this worker cannot read (version skew): refused, with what is known of it."""
    now = timezone.now()
    run, _ = Run.objects.update_or_create(
        job_id=job_id,
        attempt=attempt,
        defaults=dict(kind="unknown", host=host, queue=queue, started_at=now, ended_at=now,
                      outcome=Outcome.POLICY, reason="job-payload-invalid"),
    )
    return run
