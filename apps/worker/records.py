"""The one place a Run row is written.

A record is evidence: the first one written for a job's attempt stands, and a second write for the same
attempt (a killed work horse's worker settling it after the horse wrote its own, say) changes nothing. Two
fields change later, each in one function here: the publish fields (`Publish again`) and a lost attempt's
`lost_retry` (a cancel that came between the record and the retry it announced).
"""

import logging

from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone

from apps.worker import run_logs
from apps.worker.forges.publishing import changes as work_changes
from apps.worker.gates.verdicts import Verdict
from apps.worker.jobs import JobSpec
from apps.worker.models import Outcome, Run
from apps.worker.scrubbing import Scrubber

logger = logging.getLogger("pidispatch.runs")

# Sent after a run record is written (kwargs: run, spec). The receiver disarms spent one-shot rules on it,
# and the worker posts the run's status comment.
run_recorded = Signal()


def _existing_trigger(trigger_id: int | None) -> int | None:
    """The trigger may have been deleted while its job waited: the record then keeps its type, not a link."""
    if trigger_id is None:
        return None
    triggers = Run._meta.get_field("trigger").related_model.objects
    return trigger_id if triggers.filter(pk=trigger_id).exists() else None


def _existing_limit(limit_id: int | None) -> int | None:
    """The limit may have been deleted since it refused: the record then keeps the reason, not a link."""
    if limit_id is None:
        return None
    limits = Run._meta.get_field("refused_by_limit").related_model.objects
    return limit_id if limits.filter(pk=limit_id).exists() else None


def _create_once(job_id: str, attempt: int, fields: dict) -> tuple[Run, bool]:
    try:
        with transaction.atomic():
            return Run.objects.create(job_id=job_id, attempt=attempt, **fields), True
    except IntegrityError:
        logger.warning("run_already_recorded job=%s attempt=%s", job_id, attempt)
        return Run.objects.get(job_id=job_id, attempt=attempt), False


def forge_message_field(said: str) -> str:
    """The forge's own words for a refusal as the run record keeps them: scrubbed of every forge token this deployment
    holds (the client already cut token-shaped text), within the field's bound."""
    if not said:
        return ""
    from apps import forge_registry
    from apps.worker.forges import forge_client

    tokens = [token for token in (forge_client(name).token for name in forge_registry.NAMES) if token]
    scrubbed = Scrubber(tokens).scrub(said) if tokens else said
    return scrubbed[:Run._meta.get_field("forge_message").max_length]


def publication_fields(publication) -> dict:
    if publication is None:
        return {}
    fields = {"publish_outcome": publication.outcome, "pull_request": publication.pull_request,
              "pushed_commits": publication.pushed_commits, "publish_url": publication.url,
              "changed_files": publication.changed_files}
    if publication.forge_message:
        fields["forge_message"] = forge_message_field(publication.forge_message)
    if publication.refusal:
        fields["publish_refusal"] = publication.refusal[:Run._meta.get_field("publish_refusal").max_length]
    return fields


def record_publication(run: Run, publication) -> None:
    """A later publish of a kept run's work (`Publish again`): the one change a run record takes after it is
    written, and only to its publish fields."""
    Run.objects.filter(pk=run.pk).update(**publication_fields(publication))
    logger.info("run_publication job=%s attempt=%s outcome=%s", run.job_id, run.attempt, publication.outcome)


def record_sandbox_until(job_id: str, until) -> None:
    """A pinned sandbox (`manage.py sandbox --pin`): the job's latest record says how long its folder stays."""
    latest = Run.objects.filter(job_id=job_id).order_by("-attempt").first()
    if latest is not None:
        Run.objects.filter(pk=latest.pk).update(sandbox_until=until)


def record_lost_retry(run: Run, decision: str) -> None:
    """A lost attempt's retry decision changed before it was carried out (an operator cancelled the job)."""
    Run.objects.filter(pk=run.pk).update(lost_retry=decision)
    run.lost_retry = decision
    logger.info("run_lost_retry job=%s attempt=%s lost_retry=%s", run.job_id, run.attempt, decision)


def record_run(spec: JobSpec, verdict: Verdict, *, attempt: int, host: str, queue: str) -> Run:
    telemetry = verdict.telemetry
    run, created = _create_once(spec.job_id, attempt, dict(
        kind=spec.kind,
        target=spec.target,
        scope=spec.scope,
        flow=spec.flow,
        command=spec.command,
        trigger_id=_existing_trigger(spec.trigger_id),
        trigger_type=spec.trigger_type,
        refused_by_limit_id=_existing_limit(verdict.refused_by_limit_id),
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
        ledgers=verdict.ledgers or None,
        replica=spec.replica,
        replicas=spec.replicas,
        parent_job_id=spec.parent_job_id,
        project=spec.project,
        chain_depth=spec.chain_depth,
        chain_children=list(verdict.chain_children),
        chain_refusals=verdict.chain_refusals,
        # Only the summary's length: its text (agent output) is kept with the run's log, or not at all.
        summary_chars=len(verdict.summary) if verdict.exit_code is not None else None,
        lost_retry=verdict.lost_retry,
        sandbox_until=verdict.sandbox_until,
        **verdict.dollars,
        **verdict.session,
        **verdict.size,
        **{"forge_message": forge_message_field(verdict.forge_message), **publication_fields(verdict.publication)},
    ))
    if created:
        run_logs.keep(run, verdict.log)
        work_changes.keep(run, verdict.publication.changes if verdict.publication is not None else None)
        logger.info(
            "run_recorded job=%s attempt=%s outcome=%s reason=%s exit=%s",
            spec.job_id, attempt, verdict.outcome, verdict.reason or "-", verdict.exit_code,
        )
        run_recorded.send(sender=Run, run=run, spec=spec)
    return run


def record_unreadable_job(job_id: str, *, attempt: int, host: str, queue: str) -> Run:
    """A job whose payload this worker cannot read (version skew): refused, with what is known of it."""
    now = timezone.now()
    run, _ = _create_once(job_id, attempt, dict(kind="unknown", host=host, queue=queue, started_at=now,
                                                ended_at=now, outcome=Outcome.POLICY, reason="job-payload-invalid"))
    return run
