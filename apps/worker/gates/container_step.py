"""The steps of `ladder.GATES` from the container on: 13 the container behind its egress gateway (the only step that
spends), 14 publishing a completed forge run's work, 14b a completed run's chained children. What the container
exit means (`classify`) and the container's closed environment live here too.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from dataclasses import replace

from django.conf import settings
from django.utils import timezone
from docker.errors import NotFound
from redis.exceptions import RedisError

from apps.fleet import cancel
from apps.worker import run_logs
from apps.worker.chaining import service as chaining
from apps.worker.forges.publishing import service as publishing
from apps.worker.forges.publishing.work import bot_identity
from apps.worker.gates import budget, runtime_settings
from apps.worker.gates.attempt import Attempt, ContainerSize
from apps.worker.gates.steps import job_model
from apps.worker.gates.verdicts import GateFault, GateRefusal, Verdict
from apps.worker.jobs import JobSpec
from apps.worker.models import Outcome
from apps.worker.progress.tracker import Ticker
from apps.worker.sandbox import container, folder_forge, gateway
from apps.worker.sandbox.egress_policy import parse_allowlist
from apps.worker.sandbox.exitline import Telemetry, parse_exit_line, parse_summary
from apps.worker.scrubbing import Scrubber
from apps.worker.sessions import store as sessions

logger = logging.getLogger("pidispatch.ladder")

EXIT_COMPLETED, EXIT_INFRASTRUCTURE, EXIT_POLICY = 0, 1, 2
EXIT_KILLED = 137
# The runner could not even be executed (docker's and tini's "cannot run"/"not found" codes).
EXITS_NEVER_STARTED = {125, 126, 127}


def run_in_container(attempt: Attempt) -> None:
    """13. The container, behind its egress gateway. The gateway, the disk watches and the live page's ticker are
    held until the container ends; from the gateway's start the attempt may spend, so a fault no longer sends it
    back and an open dollar hold is kept whole unless the verdict says nothing ran."""
    spec = attempt.spec
    started = time.perf_counter()
    attempt.spending = True
    egress = gateway.EgressGateway(
        job_id=spec.job_id, upstream=attempt.upstream, key=attempt.credential[1],
        allow=parse_allowlist(settings.PI_EGRESS_ALLOW), limits=attempt.gateway_limits, redis=attempt.redis,
        owner=attempt.user, on_stop=lambda reason: container.stop_job_container(spec.job_id),
    )
    running = ExitStack()
    attempt.hold("container", running.close)  # closed as soon as the container ends; at the latest, as the climb ends
    try:
        egress.start()
    except gateway.GatewayUnavailable as exc:
        logger.error("egress_gateway_unavailable job=%s why=%s", spec.job_id, exc)
        raise GateFault("egress-gateway-unavailable") from None
    running.callback(egress.close)
    for each in attempt.watches:
        each.start()
        running.callback(each.close)
    attempt.scrub = [attempt.credential[1], *attempt.secret_values.values()]
    ticker = _progress_ticker(attempt, egress)
    if ticker is not None:
        running.callback(ticker.close)
    with running:
        attempt.result = _run(attempt, egress)
    container_seconds = time.perf_counter() - started
    logger.info("job_phases job=%s gates_ms=%.1f workspace_ms=%.1f container_ms=%.1f", spec.job_id,
                (started - attempt.clock - attempt.workspace_seconds) * 1000,
                attempt.workspace_seconds * 1000, container_seconds * 1000)
    attempt.verdict = _judge(attempt, egress)
    _keep_output(attempt)


def publish(attempt: Attempt) -> None:
    """14. Publish: the worker, not the agent, takes the work to the forge (never a credential in what it posts). A
    cron job's folder on GitHub is published as a job on that repository (folder_forge.py says how)."""
    spec, forge, verdict = attempt.spec, attempt.forge, attempt.verdict
    published_as = replace(spec, kind="github", repo=forge.repo) \
        if isinstance(forge, folder_forge.FolderOnGitHub) else spec
    publication, reason = publishing.publish_run(published_as, forge, attempt.dirs.root, attempt.dirs.workspace,
                                                 verdict.summary, attempt.result.ended_at,
                                                 credentials={attempt.credential[0]: attempt.credential[1]},
                                                 job_secrets=attempt.secret_values)
    verdict = replace(verdict, publication=publication)
    if reason == publishing.UNAVAILABLE:
        verdict = replace(verdict, outcome=Outcome.FAILED, reason=reason, retryable=False)
    elif reason:
        verdict = replace(verdict, outcome=Outcome.POLICY, reason=reason)
    attempt.verdict = verdict


def chain(attempt: Attempt) -> None:
    """14b. Chaining: only a completed run's requests are read, once (its record names the children)."""
    found = chaining.collect(attempt.spec, attempt.dirs.outbox, attempt.chainable, attempt.chain_pi_tree)
    attempt.verdict = replace(attempt.verdict, chain_children=found.children, chain_refusals=found.refusals)


def completed(attempt: Attempt) -> bool:
    return attempt.verdict is not None and attempt.verdict.outcome == Outcome.COMPLETED


def completed_forge_run(attempt: Attempt) -> bool:
    return completed(attempt) and attempt.forge is not None


def _run(attempt: Attempt, egress: gateway.EgressGateway) -> container.ContainerExit:
    spec, runtime, dirs, resume = attempt.spec, attempt.runtime, attempt.dirs, attempt.resume
    size = attempt.job_size
    attempt.size = ContainerSize(user=attempt.user, memory=size.memory, cpus=size.cpus)
    try:
        return container.run_container(
            attempt.engine,
            job_id=spec.job_id,
            host=attempt.host,
            image=attempt.image,
            job_dir=dirs.job,
            workspace=dirs.workspace,
            environment=container_environment(spec, runtime, attempt.provider,
                                              {**egress.container_environment(), **attempt.overlay.environment()},
                                              attempt.secret_values, attempt.served),
            timeout_seconds=settings.PI_JOB_TIMEOUT_SECONDS,
            user=attempt.user,
            memory=size.memory,
            cpus=size.cpus,
            labels=size.labels(spec.project),  # a worker starting beside it counts it in the host budget
            egress_mounts=egress.mounts(),
            overlay_mounts=attempt.overlay.mounts(),
            log_bytes=settings.PI_JOB_LOG_MAX_BYTES if settings.PI_CAPTURE_JOB_LOGS else 0,
            session_folder=resume.folder if resume is not None else None,
            outbox=dirs.outbox,
        )
    except container.ImageMissing:
        raise GateRefusal("job-image-missing") from None
    except container.NeverStarted:
        raise GateFault("container-never-started") from None
    except container.EngineUnavailable:
        raise GateFault("docker-unavailable", budget_reserved=True) from None


def _judge(attempt: Attempt, egress: gateway.EgressGateway) -> Verdict:
    """What the run came to, and its spend settled. From here a Redis fault must not turn its outcome into a retry
    (which would run the agent again): what cannot be settled now is logged, and the counters' TTLs bound the drift."""
    result, spec = attempt.result, attempt.spec
    verdict = classify(result, egress.report, attempt.runtime)
    # The watch's last look, once the container has ended: what it wrote since the last sample counts too.
    exceeded = any(each.exceeded for each in attempt.watches)
    if exceeded or any(each.over_limit() for each in attempt.watches):
        verdict = Verdict.refused("workspace-too-large", exit_code=verdict.exit_code, telemetry=verdict.telemetry,
                                  budget_reserved=True)
    if _cancelled_after_run(spec.job_id, attempt.redis):
        # The operator stopped it: whatever the exit code says, the run ends as their decision.
        verdict = Verdict.refused("operator-cancel", exit_code=verdict.exit_code,
                                  telemetry=verdict.telemetry, budget_reserved=True)
    try:
        # The dollar hold: charged what the gateway metered, unless that cannot be the whole cost (a run stopped
        # from outside may have had a call cut mid-answer): then the whole hold stays (floor). A verdict that says
        # nothing ran refunds it (and gives the job-count slot back as the climb lets go).
        killed = result.timed_out or exceeded or verdict.reason in ("operator-cancel", "oom-killed")
        budget.settle_dollars(attempt.redis, attempt.dollars, ran=verdict.budget_reserved,
                              cost=None if killed else egress.report.meter.known_cost())
        # The gateway counted its tokens into the day as they were spent; what it could not is settled here.
        unmetered = 0 if egress.report.meter.metered else (verdict.telemetry.tokens_total or 0)
        budget.record_tokens(attempt.redis, unmetered + egress.unrecorded_tokens, attempt.now)
    except RedisError:
        logger.warning("job_post_run_redis_failed job=%s", spec.job_id)
    return verdict


def _keep_output(attempt: Attempt) -> None:
    """The agent's summary, kept only with its run's log (PI_CAPTURE_JOB_LOGS) and scrubbed like it; a `run.resume`
    job's session, kept only when the run completed (any other end leaves the target's earlier session as it was)."""
    verdict, result = attempt.verdict, attempt.result
    summary = parse_summary(result.output_tail)
    forge_tokens = publishing.forge_tokens(attempt.forge) if attempt.forge is not None else []
    scrub = [*attempt.scrub, *forge_tokens]
    verdict = replace(verdict, summary=summary, log=run_logs.captured(result.log, summary, scrub))
    if attempt.resume is not None:
        resume = attempt.resume
        if verdict.outcome == Outcome.COMPLETED:
            resume = sessions.promote(resume, attempt.spec, attempt.host, scrub, now=timezone.now())
        verdict = replace(verdict, session=resume.record_fields())
    attempt.verdict = verdict


def job_max_turns(spec: JobSpec, runtime: runtime_settings.RuntimeSettings) -> int:
    """A trigger's (or a manual run's) `maxTurns` lowers the deployment's cap, never raises it."""
    if spec.max_turns and runtime.max_turns:
        return min(spec.max_turns, runtime.max_turns)
    return spec.max_turns or runtime.max_turns


def container_environment(spec: JobSpec, runtime: runtime_settings.RuntimeSettings, provider: str,
                          egress: dict[str, str], secret_values: dict[str, str] | None = None,
                          allowed: tuple[str, ...] = ()) -> dict[str, str]:
    """The container's whole environment, from a closed list: nothing of the worker's is inherited, and no
    credential at all: no provider key (the gateway adds it outside), no forge token (the worker publishes).
    `egress` points pi and every other client at the gateway; the bot identity names the agent's commits.
    The job's resolved secrets come last; gate 9 refused any name that could shadow one of the above."""
    environment = {
        "HOME": container.JOB_HOME,
        "PI_JOB_ID": spec.job_id,
        "PI_MAX_TURNS": str(job_max_turns(spec, runtime)),
        "PI_PROVIDER": provider,
    }
    if spec.flow:
        environment["PI_FLOW"] = spec.flow
    else:
        environment["PI_COMMAND"] = spec.command
    model = job_model(spec)
    if model:
        environment["PI_MODEL"] = model
    if allowed:  # the models pi may choose among (the runner passes them as --models)
        environment["PI_ALLOWED_MODELS"] = ",".join(f"{provider}/{model}" for model in allowed)
    if spec.exclude_tools:
        environment["PI_EXCLUDE_TOOLS"] = ",".join(spec.exclude_tools)
    environment.update(egress)
    environment.update(bot_identity().environment())
    environment.update(secret_values or {})
    return environment


def classify(result: container.ContainerExit, egress: gateway.EgressReport | None = None,
             runtime: runtime_settings.RuntimeSettings | None = None) -> Verdict:
    """Exit code to outcome. What the gateway saw decides before it: a stop it made is the run's policy end,
    and a failure after the gateway refused a call (or the provider refused the key) is that refusal, not a
    fault to retry. The exit line adds numbers; it never changes the classification."""
    code = result.exit_code
    exit_line = parse_exit_line(result.output_tail, code)
    fields = {"exit_code": code, "telemetry": _telemetry(exit_line, egress, runtime), "budget_reserved": True}
    if egress is not None and egress.stop_reason:
        return Verdict.refused(egress.stop_reason, **fields)
    if result.timed_out:
        return Verdict.refused("worker-abort", **fields)
    if code == EXIT_COMPLETED:
        return Verdict(outcome=Outcome.COMPLETED, **fields)
    if egress is not None and egress.auth_refused:
        return Verdict.refused("provider-auth-refused", **fields)
    if code == EXIT_POLICY:
        return Verdict.refused(exit_line.reason or "runner-policy", **fields)
    if code == EXIT_KILLED and result.oom_killed:
        return Verdict.refused("oom-killed", **fields)
    if code in EXITS_NEVER_STARTED:
        return Verdict.infrastructure_fault("container-never-started", **{**fields, "budget_reserved": False})
    if egress is not None and egress.denied:
        return Verdict.refused("egress-denied", **fields)
    if code == EXIT_INFRASTRUCTURE:
        return Verdict.infrastructure_fault("runner-infra", **fields)
    return Verdict.infrastructure_fault("container-exit-unknown", **fields)


def _telemetry(exit_line: Telemetry, egress: gateway.EgressReport | None,
               runtime: runtime_settings.RuntimeSettings | None) -> Telemetry:
    """The gateway's count when it forwarded any provider call; otherwise the runner's claim, which is
    untrusted: its token counts are clamped to the job's budget (or the day's cap), so it can neither stop
    the day's jobs with a made-up 10^12 nor be trusted past what the job could have spent."""
    if egress is not None and egress.meter.metered:
        telemetry = egress.meter.telemetry(turns=exit_line.turns)
    else:
        telemetry = exit_line
        ceiling = runtime and (runtime.max_tokens or runtime.daily_token_cap)
        if ceiling:
            clamp = lambda value: None if value is None else min(value, ceiling)  # noqa: E731
            telemetry = replace(exit_line, tokens_in=clamp(exit_line.tokens_in),
                                tokens_out=clamp(exit_line.tokens_out), tokens_total=clamp(exit_line.tokens_total))
    if egress is not None and egress.refusals:
        # Which provider calls the gateway did not forward, and why (reason tokens and counts only).
        refused = {"refusals": dict(sorted(egress.refusals.items()))}
        if egress.unpriced_model:
            refused["unpricedModel"] = egress.unpriced_model
        telemetry = replace(telemetry, usage={**(telemetry.usage or {}), "gateway": refused})
    return telemetry


def _cancelled_after_run(job_id: str, redis, attempts: int = 20) -> bool:
    """Whether an operator cancelled the job, asked once its container ended. A worker whose host was cut off
    carries out a pending cancel the moment Redis answers again, and the first calls on its pool may still fail
    then: asked again for a few seconds, so the run is recorded as the operator's decision, not as a stopped
    container's exit code."""
    for attempt in range(attempts):
        try:
            return cancel.is_cancel_requested(job_id, redis)
        except RedisError:
            if attempt + 1 < attempts:
                time.sleep(0.5)
    logger.warning("job_cancel_unknown job=%s why=redis-unavailable", job_id)
    return False


def _progress_ticker(attempt: Attempt, egress: gateway.EgressGateway) -> Ticker | None:
    """The live page's view of the container: the gateway's count so far and, with PI_CAPTURE_JOB_LOGS, its output
    scrubbed as its kept log will be (the forge token too, once the workspace holds one)."""
    if attempt.progress is None:
        return None
    read_output = None
    if settings.PI_CAPTURE_JOB_LOGS:
        forge_tokens = publishing.forge_tokens(attempt.forge) if attempt.forge is not None else []
        scrubber = Scrubber([*attempt.scrub, *forge_tokens])

        def read_output() -> str | None:
            try:
                logs = container.engine().containers.get(container.container_name(attempt.spec.job_id)).logs(
                    stdout=True, stderr=True, tail=400)
            except NotFound:
                return None  # not created yet, or already removed
            return scrubber.scrub(logs.decode(errors="replace"))
    return Ticker(attempt.progress, meter=egress.report.meter, read_output=read_output).start()
