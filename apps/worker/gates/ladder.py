"""The gate ladder: free checks before costly ones, budget before tokens, and the container last. Each gate
lets the job climb on, defers it (`Deferred`: back to the scheduled registry, no attempt, no record), or ends
it with a `Verdict` (refused, or an infrastructure fault to retry).

The order: 1 cancelled before start, 2 pause windows, 3 wait-for, 4 host slot, scope concurrency and folder
mutex, 5 settings overlay, 6 one-shot spent, 7 image preflight, 8 provider credential, 9 secrets,
10 workspace, 11 daily token cap and dollar windows, 12 job-count caps, 13 the container behind its egress
gateway, 14 publish, then a completed run's chained children (apps/worker/chaining/). Every gate's module, the
reasons it can end a job with, and what it defers for: docs/architecture.md, "The gate ladder".
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from docker.errors import NotFound
from redis.exceptions import RedisError

from apps.fleet import cancel
from apps.fleet.connection import get_redis
from apps.worker import accepted, allowed_models, run_logs
from apps.worker.chaining import service as chaining
from apps.worker.chaining import skills as chain_skills
from apps.worker.forges import ForgeFailure
from apps.worker.forges.publishing import kept
from apps.worker.forges.publishing import service as publishing
from apps.worker.forges.publishing.work import bot_identity
from apps.worker.gates import (
    budget,
    budget_rebuild,
    host_slots,
    leases,
    quiet_hours,
    runtime_settings,
    secrets,
    waitfor,
)
from apps.worker.gates.scopes import job_scopes, normalise_folder, scope_hash
from apps.worker.gates.verdicts import Deferred, Verdict, database_unavailable
from apps.worker.jobs import FORGE_KINDS, JobSpec, job_time_budget_seconds
from apps.worker.models import Outcome, PauseWindow, Run
from apps.worker.progress.tracker import Progress, Ticker
from apps.worker.sandbox import (
    agent_config,
    container,
    disk,
    folder_forge,
    forge_workspace,
    gateway,
    jobfiles,
    pi_overlay,
    prices,
    providers,
    sandboxes,
    venues,
)
from apps.worker.sandbox.egress_policy import parse_allowlist
from apps.worker.sandbox.exitline import Telemetry, parse_exit_line, parse_summary
from apps.worker.sandbox.workspace import WorkspaceRefused, check_local_folder
from apps.worker.scrubbing import Scrubber
from apps.worker.sessions import store as sessions

logger = logging.getLogger("pidispatch.ladder")

EXIT_COMPLETED, EXIT_INFRASTRUCTURE, EXIT_POLICY = 0, 1, 2
EXIT_KILLED = 137
REBUILD_RECHECK_SECONDS = 2  # a job arriving while another process rebuilds the budget windows looks again then
# The runner could not even be executed (docker's and tini's "cannot run"/"not found" codes).
EXITS_NEVER_STARTED = {125, 126, 127}


@dataclass
class Attempt:
    """One climb of the ladder: what it holds must be let go whatever happens."""

    spec: JobSpec
    host: str
    now: datetime
    image: str = ""
    held_leases: list[leases.Lease] = field(default_factory=list)
    dirs: jobfiles.JobDirs | None = None  # the job's folders, from gate 10 on
    forge: forge_workspace.ForgeWorkspace | None = None  # a forge job's clone and token, from gate 10 on
    clock: float = field(default_factory=time.perf_counter)  # for the phase timings in the log
    workspace_seconds: float = 0.0  # of which the workspace (a local folder's git checks; a forge clone)
    spending: bool = False  # from the egress gateway's start on: a fault no longer sends the job back
    dollars: budget.DollarHold | None = None  # the dollar hold, from gate 11 on
    reservation: budget.Reservation | None = None  # the job-count slots, from gate 12 on (given back: none)
    refused_counted: list[str] = field(default_factory=list)  # a cap's refusal: the windows it still counts in
    container_ran: bool = False  # the container may have spent: an unsettled dollar hold is kept whole
    chainable: frozenset[str] = frozenset()  # flows whose skill allows being chained, read before the agent ran
    chain_pi_tree: str = ""  # the `.pi/` the chain's first job started on (chain_skills.pi_digest)
    # What the container ran with, for a sandbox on its folder afterwards (apps/worker/sandbox/sandboxes.py).
    limits: tuple[tuple[int, int], str, float] | None = None
    # Where the climb is, for the job's live page (apps/worker/progress/); None when nobody watches (tests in process).
    progress: Progress | None = None
    image_id: str = ""  # the image the preflight found (a sandbox runs that one, whatever the tag names later)
    sandbox_until: datetime | None = None

    def passed(self, phase: str) -> None:
        if self.progress is not None:
            self.progress.passed(phase)

    def ledgers(self) -> dict:
        """Where this attempt counted (job-count and dollar ledgers), for its run record: the budget windows are
        rebuilt from the run records when Redis lost them (budget_rebuild.py)."""
        counted = self.reservation.keys if self.reservation is not None else self.refused_counted
        held = self.dollars.keys if self.dollars is not None else []
        if not counted and not held:
            return {}
        return {"jobs": budget.ledgers_of(counted), "usd": budget.ledgers_of(held)}

    @property
    def holder(self) -> str:
        return leases.holder_id(self.host, self.spec.job_id)

    def let_go(self, redis) -> None:
        """Whatever the climb ended in: an unsettled dollar hold refunded (no container ran) or kept whole, leases
        back, a minted token revoked, the job's folders removed."""
        if self.dollars is not None and not self.dollars.settled:
            try:
                budget.settle_dollars(redis, self.dollars, ran=self.container_ran, cost=None)
            except RedisError:
                logger.warning("dollar_settle_failed job=%s kept=hold", self.spec.job_id)
                budget.keep_hold(self.dollars)
        leases.release_all(redis, self.held_leases, self.spec.job_id)
        if self.forge is not None:
            try:
                self.forge.release()
            except Exception:  # a token that could not be revoked still expires within the hour
                logger.warning("forge_token_release_failed job=%s", self.spec.job_id)
        if self.dirs is not None and self.container_ran and self.limits is not None:
            user, memory, cpus = self.limits
            self.sandbox_until = sandboxes.retain(
                self.dirs, job_id=self.spec.job_id, image=self.image_id or self.image, user=user, memory=memory,
                cpus=cpus, host=self.host, now=timezone.now())
        if self.dirs is not None and (settings.PI_KEEP_JOB_DIRS or self.sandbox_until is not None):
            jobfiles.let_go(self.dirs)  # kept whole: for debugging, or for the sandbox (its KEEP_UNTIL)
        elif self.dirs is not None and kept.is_kept(self.dirs.root):
            kept.strip_to_kept(self.dirs.root)  # the unpublished work stays (KEEP_UNTIL); the prompt and clone go
            jobfiles.let_go(self.dirs)
        elif self.dirs is not None:
            jobfiles.remove(self.dirs)


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


def job_model(spec: JobSpec) -> str:
    return spec.model or settings.PI_MODEL


def held_model(spec: JobSpec, upstream: providers.Upstream) -> str:
    """The model the gateway holds the job to, or "" when it cannot (none named, or a fuzzy pattern like
    `sonnet` pi would resolve to a model the gateway cannot tell apart from another)."""
    model = job_model(spec)
    return model if model and (not upstream.builtin or prices.is_listed(upstream.provider, model)) else ""


def job_models(spec: JobSpec, upstream: providers.Upstream, served: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The models a job may call, as `provider/model`, for its `model:` scoped-limit rows: its provider's models on
    its allowed-model list (`served`), else its one exact model; None when it may call any (it then reserves in
    every model row, as the ancestor does)."""
    if served:
        return tuple(f"{upstream.provider}/{model}" for model in served)
    model = held_model(spec, upstream)
    return (f"{upstream.provider}/{model}",) if model else None


def container_size(rows: budget.MatchedRows, runtime: runtime_settings.RuntimeSettings) -> tuple[str, float]:
    """The container's memory and CPUs: the job's project row's (scoped limits v3) over the deployment's."""
    project = rows.project
    memory = project.memory if project is not None and project.memory else runtime.job_memory
    cpus = float(project.cpus) if project is not None and project.cpus is not None else runtime.job_cpus
    return memory, cpus


def gateway_limits(spec: JobSpec, upstream: providers.Upstream, runtime: runtime_settings.RuntimeSettings,
                   max_cost_micros: int | None = None, allowed: tuple[str, ...] = ()):
    """The job's token budget, the day's cap and its dollar cap. With an allowed-model list the gateway forwards
    the listed models of the job's provider (`allowed`) and no other; without one, the model is held to only when
    it names one exactly (pi also takes fuzzy patterns like `sonnet`, which the gateway cannot tell apart from
    another model)."""
    return gateway.Limits(max_tokens=runtime.max_tokens, daily_token_cap=runtime.daily_token_cap,
                          model="" if allowed else held_model(spec, upstream), max_cost_micros=max_cost_micros,
                          allowed_models=frozenset(each.lower() for each in allowed))


def served_models(spec: JobSpec, provider: str) -> tuple[str, ...] | str:
    """The job's provider's models on its allowed-model list (() when there is no list), or the refusal's reason:
    a list that cannot be read, a main model off it, or no model of the job's provider on it (its gateway serves
    that provider only, so nothing could be called)."""
    try:
        listed = allowed_models.effective(allowed_models.check(spec.models, "run.models") if spec.models else ())
    except allowed_models.ModelListError:
        logger.error("allowed_models_invalid job=%s source=%s", spec.job_id,
                     "job" if spec.models else "PI_ALLOWED_MODELS")
        return "job-payload-invalid" if spec.models else "model-not-allowed"
    if not listed:
        return ()
    model = job_model(spec)
    if model and not allowed_models.is_listed(listed, provider, model):
        logger.info("model_not_allowed job=%s provider=%s why=main-model-unlisted", spec.job_id, provider)
        return "model-not-allowed"
    served = allowed_models.for_provider(listed, provider)
    if not served:
        logger.info("model_not_allowed job=%s provider=%s why=no-listed-model-of-provider", spec.job_id, provider)
        return "model-not-allowed"
    return served


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


def warm_up() -> None:
    """Run the gates' database reads once in the worker's main process, before it forks any work horse.

    Every job runs in a fresh fork. What Django builds lazily on a model's first query (field caches,
    compiled lookups) is then inherited by each horse instead of rebuilt per job: about 5 ms of the gates.
    """
    from apps.worker.models import DispatchSettings, ScopedLimit

    try:
        list(PauseWindow.objects.filter(enabled=True)[:1])
        list(ScopedLimit.objects.filter(scope__in=["-"])[:1])
        DispatchSettings.objects.filter(pk=1).first()
        Run.objects.filter(trigger_id=0).exclude(job_id="-").filter(started_at__gte=timezone.now()).exists()
    except DatabaseError:
        logger.warning("worker_warm_up_skipped reason=database")  # only slower: each job pays it again


def run(spec: JobSpec, host: str, progress: Progress | None = None) -> Verdict | Deferred:
    attempt = Attempt(spec=spec, host=host, now=timezone.now(), image=spec.image or settings.PI_JOB_IMAGE,
                      progress=progress)
    redis = get_redis()
    try:
        outcome = _climb(attempt, redis)
    except RedisError:
        logger.warning("job_redis_unavailable job=%s", spec.job_id)
        outcome = Verdict.infrastructure_fault("redis-unavailable")
    except DatabaseError as error:
        if attempt.spending:
            raise
        logger.warning("job_database_unavailable job=%s error=%s", spec.job_id, type(error).__name__)
        outcome = database_unavailable()
    except OSError as error:
        if attempt.spending or not disk.is_full(error):
            raise
        logger.warning("job_disk_full job=%s error=%s", spec.job_id, errno.errorcode.get(error.errno, "-"))
        outcome = Verdict.infrastructure_fault("disk-full")
    finally:
        attempt.let_go(redis)
    if isinstance(outcome, Deferred):
        logger.info("job_deferred job=%s reason=%s until=%s", spec.job_id, outcome.reason, outcome.until.isoformat())
        return outcome
    dollars = attempt.dollars.record_fields() if attempt.dollars is not None else {}
    return replace(outcome, image=attempt.image, started_at=attempt.now, ended_at=timezone.now(), dollars=dollars,
                   ledgers=attempt.ledgers(), sandbox_until=attempt.sandbox_until)


def _progress_ticker(attempt: Attempt, egress: gateway.EgressGateway, scrub: list[str]) -> Ticker | None:
    """The live page's view of the container: the gateway's count so far and, with PI_CAPTURE_JOB_LOGS, its output
    scrubbed as its kept log will be (the forge token too, once the workspace holds one)."""
    if attempt.progress is None:
        return None
    read_output = None
    if settings.PI_CAPTURE_JOB_LOGS:
        scrubber = Scrubber([*scrub, *(publishing.forge_tokens(attempt.forge) if attempt.forge is not None else [])])

        def read_output() -> str | None:
            try:
                logs = container.engine().containers.get(container.container_name(attempt.spec.job_id)).logs(
                    stdout=True, stderr=True, tail=400)
            except NotFound:
                return None  # not created yet, or already removed
            return scrubber.scrub(logs.decode(errors="replace"))
    return Ticker(attempt.progress, meter=egress.report.meter, read_output=read_output).start()


def _climb(attempt: Attempt, redis) -> Verdict | Deferred:
    spec, now = attempt.spec, attempt.now

    # 1. An operator cancelled it while it was on its way to this worker.
    if cancel.is_cancel_requested(spec.job_id, redis):
        return Verdict.refused("operator-cancel")

    # 2. Quiet hours.
    until = quiet_hours.paused_until(PauseWindow.objects.filter(enabled=True), job_scopes(spec), now)
    if until is not None and until > now + timedelta(seconds=1):
        return Deferred(until, "pause-window", {"windowEnds": until.isoformat()})
    attempt.passed("quiet-hours")

    # 3. Wait-for.
    waited = waitfor.gate(redis, spec, now)
    if waited.refuse:
        return Verdict.refused(waited.refuse)
    if waited.defer_until is not None:
        return Deferred(waited.defer_until, waited.reason, waited.detail or {})
    attempt.passed("wait-for")

    # 4. The host's slot (PI_CONCURRENCY), a forge scope's concurrency (fleet-wide) and the local-folder mutex
    # (per host). A folder's path names no repository across hosts (`/srv/site` on two hosts is two repositories
    # sharing a layout), so a local scope never takes a fleet-wide slot: its folder mutex, one job per folder on
    # its host, is already as narrow as any `concurrent` it could have.
    host_busy = host_slots.take(redis, attempt)
    if host_busy is not None:
        return host_busy
    rows = budget.rows_for(spec)
    limit = rows.scope
    lease_ttl = job_time_budget_seconds()
    slots = []
    if spec.kind == "local":
        slots.append((f"f:{attempt.host}:{scope_hash(normalise_folder(spec.folder))}", 1))
    elif limit is not None and limit.concurrent:
        slots.append((f"s:{scope_hash(limit.scope)}", limit.concurrent))
    if rows.project is not None and rows.project.concurrent:
        # A project's runs at once, fleet-wide, local members too (taken after the narrower slot).
        slots.append((f"s:{scope_hash(rows.project.scope)}", rows.project.concurrent))
    for name, count in slots:
        lease = leases.acquire(redis, name, count, attempt.holder, lease_ttl)
        if lease is None:
            recheck = now + timedelta(seconds=settings.PI_SCOPE_BUSY_RECHECK_SECONDS)
            return Deferred(recheck, "scope-busy", {"slots": count})
        attempt.held_leases.append(lease)
    attempt.passed("slots")

    # 5. Settings: the DB row over the environment.
    try:
        runtime = runtime_settings.current()
    except runtime_settings.SettingsInvalid as exc:
        logger.error("settings_overlay_invalid job=%s detail=%s", spec.job_id, exc)
        return Verdict.refused("settings-overlay-invalid")

    # 6. A one-shot rule already spent by another job since it was (re-)armed.
    if spec.once and spec.trigger_id is not None:
        armed = datetime.fromisoformat(spec.once_armed_at) if spec.once_armed_at else None
        if Run.objects.spent_by_trigger(spec.trigger_id, other_than=spec.job_id, since=armed):
            return Verdict.refused("once-already-spent")

    # 6b. The venue: one this host's environment blesses, and one this worker can run.
    refused_venue = venues.refusal(spec.backend)
    if refused_venue is not None:
        reason, why = refused_venue
        logger.info("backend_refused job=%s backend=%s reason=%s why=%s", spec.job_id, spec.backend or venues.DEFAULT,
                    reason, why)
        return Verdict.refused(reason)
    attempt.passed("settings")

    # 7. The image, never pulled.
    try:
        client = container.engine()
        attempt.image_id = container.preflight_image(client, attempt.image)
    except container.ImageMissing:
        return Verdict.refused("job-image-missing")
    except container.ImageIncompatible as incompatible:
        logger.error("job_image_refused job=%s image=%s reason=%s", spec.job_id, attempt.image, incompatible.reason)
        return Verdict.refused(incompatible.reason)
    except container.EngineUnavailable:
        return Verdict.infrastructure_fault("docker-unavailable")
    attempt.passed("image")

    # 8. The provider: a key on this worker and an upstream its gateway can serve (and meter).
    provider = spec.provider or settings.PI_PROVIDER
    credential = providers.credential(provider)
    upstream = providers.upstream(provider)
    if credential is None or upstream is None:
        logger.error("provider_unconfigured job=%s provider=%s variable=%s upstream=%s", spec.job_id, provider,
                     providers.key_variable(provider) or "-", "unknown" if upstream is None else "ok")
        return Verdict.refused("provider-unconfigured")

    # 8b. The allowed-model list (the trigger's run.models, else PI_ALLOWED_MODELS): its entries of the job's provider.
    served = served_models(spec, provider)
    if isinstance(served, str):
        return Verdict.refused(served)

    # 9. The job's secrets, resolved on this host (before the workspace: nothing costly for a job refused here).
    try:
        secret_values = secrets.resolve(spec)
    except secrets.SecretsRefused as refused:
        return Verdict.refused(refused.reason)
    except secrets.ResolverUnreachable:
        return Verdict.infrastructure_fault("secret-resolver-unreachable")
    attempt.passed("provider-and-secrets")

    # 10. The workspace: a local job's folder as it is; a forge job's fresh clone, made with its own token.
    workspace_folder: Path | None = None
    cron = None
    user = container.job_user()
    if spec.kind == "local":
        workspace_started = time.perf_counter()
        try:
            local = check_local_folder(spec.folder, force=spec.force)
        except WorkspaceRefused as refused:
            logger.info("workspace_refused job=%s reason=%s", spec.job_id, refused.reason)
            return Verdict.refused(refused.reason)
        attempt.workspace_seconds = time.perf_counter() - workspace_started
        workspace_folder, user = local.folder, local.owner
        if spec.github:  # a cron job whose work the worker publishes to its folder's GitHub repository
            try:
                attempt.forge = folder_forge.prepare(local.folder, local.head)
            except WorkspaceRefused as refused:
                logger.info("workspace_refused job=%s reason=%s", spec.job_id, refused.reason)
                return Verdict.refused(refused.reason)
            except ForgeFailure as failure:
                logger.warning("workspace_forge_fault job=%s reason=%s", spec.job_id, failure.reason)
                return (Verdict.infrastructure_fault if failure.transient else Verdict.refused)(failure.reason)
        if spec.trigger_type == "cron":
            previous = Run.objects.previous_cron_run_at(spec.job_id, spec.trigger_id)
            cron = jobfiles.cron_document(spec, local.head, previous)
        if chaining.may_have_children(spec):
            attempt.chainable = chain_skills.chainable_in_folder(local.folder, local.owner, spec.job_id)
    dirs = attempt.dirs = jobfiles.prepare(spec, settings.PI_JOB_ROOT, owner=user, workspace=workspace_folder,
                                           cron=cron, outbox=chaining.enabled_for(spec))
    agent_config.write(dirs.job, upstream, job_model(spec), served)
    try:  # the operator's overlay, the trigger's skills folder, and the settings.json that makes pi load them
        overlay = pi_overlay.prepare(dirs.job, packages=spec.packages, skills_dir=spec.skills_dir)
    except WorkspaceRefused as refused:
        logger.info("workspace_refused job=%s reason=%s", spec.job_id, refused.reason)
        return Verdict.refused(refused.reason)
    if spec.kind in FORGE_KINDS:
        workspace_started = time.perf_counter()
        try:
            attempt.forge = forge_workspace.prepare(spec, dirs, owner=user)
            attempt.workspace_seconds = time.perf_counter() - workspace_started
            if chaining.may_have_children(spec):
                attempt.chainable = chain_skills.chainable_in_job_folder(dirs.job)
        except WorkspaceRefused as refused:
            logger.info("workspace_refused job=%s reason=%s", spec.job_id, refused.reason)
            return Verdict.refused(refused.reason)
        except ForgeFailure as failure:
            if failure.transient:
                logger.warning("workspace_forge_fault job=%s reason=%s retry_after=%s", spec.job_id, failure.reason,
                               failure.retry_after if failure.retry_after is not None else "-")
                return Verdict.infrastructure_fault(failure.reason, retry_after_seconds=failure.retry_after or 0)
            logger.info("workspace_refused job=%s reason=%s", spec.job_id, failure.reason)
            return Verdict.refused(failure.reason, forge_message=failure.forge_message)

    if spec.parent_job_id or chaining.may_have_children(spec):
        # A chain runs on the `.pi/` its first job started on: no agent of the chain rewrites the skills, or the
        # chainable flows, of the jobs after it (its parent's commits are in a child's workspace).
        found = chain_skills.pi_digest(local.folder if spec.kind == "local" else dirs.workspace)
        if spec.parent_job_id and found != spec.chain_pi_tree:
            logger.warning("chain_pi_changed job=%s parent=%s", spec.job_id, spec.parent_job_id)
            return Verdict.refused("chain-pi-changed")
        attempt.chain_pi_tree = found
    attempt.passed("workspace")

    # The workspace's size, measured again while the container runs.
    watch = disk.WorkspaceWatch(spec.job_id, dirs.workspace, counts_whole=workspace_folder is None,
                                on_exceeded=lambda: container.stop_job_container(spec.job_id))
    if watch.over_limit():
        return Verdict.refused("workspace-too-large")
    # The outbox is the host's disk too: held to the same bounds, counted whole.
    outbox_watch = disk.WorkspaceWatch(spec.job_id, dirs.outbox, counts_whole=True,
                                       on_exceeded=lambda: container.stop_job_container(spec.job_id)) \
        if dirs.outbox is not None else None

    # 10b. `run.resume`: the target's kept session, copied into the job's folder beside its workspace (the forge
    # said whether a pull request comes from a fork; a store fault only runs the job cold).
    resume = None
    if spec.resume:
        resume = sessions.checkout(spec, dirs.root, owner=user, now=timezone.now(),
                                   pull=attempt.forge.pull if attempt.forge is not None else None)
    # The container may write its session folder and its outbox too: each is held to the workspace's bounds,
    # measured the same way.
    watches = [watch] if outbox_watch is None else [watch, outbox_watch]
    if resume is not None and resume.folder is not None:
        watches.append(disk.WorkspaceWatch(spec.job_id, resume.folder, counts_whole=True,
                                           on_exceeded=lambda: container.stop_job_container(spec.job_id)))

    # 10c. A Redis that lost its data (or came back from an older copy) gets its budget windows back from the run
    # records before any job is admitted: no cap is passed because Redis forgot (gates/budget_rebuild.py).
    try:
        budget_rebuild.ensure_rebuilt(redis, now)
    except budget_rebuild.Rebuilding:
        return Deferred(timezone.now() + timedelta(seconds=REBUILD_RECHECK_SECONDS), "budget-rebuilding")

    # 11. The daily token cap (checked before, recorded after: it may overshoot by the runs in flight).
    if runtime.daily_token_cap and budget.tokens_spent_today(redis, now) >= runtime.daily_token_cap:
        return Verdict.refused("daily-token-cap")

    # 11b. The dollar windows: the job's per-job cap held in each, in one atomic step (none when one has no room).
    try:
        attempt.dollars = budget.reserve_dollars(redis, spec, rows.calling(job_models(spec, upstream, served)),
                                                 runtime, now)
    except budget.DollarRefusal as refusal:
        window = refusal.window
        logger.info("dollar_refused job=%s reason=%s ledger=%s window=%s", spec.job_id, refusal.reason,
                    window.ledger if window else "-", window.window if window else "-")
        if refusal.reason == "cost-cap-unset":
            logger.error("dollar_cap_unset job=%s ledger=%s set=PI_MAX_COST_USD,max_cost_usd,run.maxCostUsd "
                         "why=a scoped limit's dollar window needs a per-job cap", spec.job_id, window.ledger)
        by_limit = limit.pk if limit is not None and window is not None and window.ledger != "all" else None
        return Verdict.refused(refusal.reason, refused_by_limit_id=by_limit)

    # 11c. A model the job names exactly, and every model on its allowed list, must have a price when a dollar cap
    # applies (the gateway refuses their calls otherwise; refused here, before any spend).
    limits = gateway_limits(spec, upstream, runtime, attempt.dollars.cap_micros, served)
    callable_models = list(served) or ([limits.model] if limits.model else [])
    if limits.max_cost_micros is not None and any(prices.price(upstream.provider, each.lower()) is None
                                                  for each in callable_models):
        logger.info("model_unpriced job=%s provider=%s", spec.job_id, upstream.provider)
        return Verdict.refused("model-unpriced")

    attempt.passed("spend-caps")

    # 12. Job-count caps, narrowest first.
    try:
        reservation = attempt.reservation = budget.reserve(redis, rows, runtime, now)
    except budget.CapRefusal as refusal:
        attempt.refused_counted = refusal.counted
        logger.info("cap_refused job=%s reason=%s window=%s", spec.job_id, refusal.reason, refusal.window)
        if refusal.reason == "soft-hold":
            period = budget.window_keys("all", now)[refusal.window].rsplit(":", 1)[-1]
            budget.soft_hold_reached.send_robust(sender=budget.CapRefusal, window=refusal.window, period=period,
                                                 job_id=spec.job_id)
        by_limit = limit.pk if refusal.reason == "scope-cap" and limit is not None else None
        return Verdict.refused(refusal.reason, budget_reserved=refusal.budget_reserved, refused_by_limit_id=by_limit)

    accepted.spending(spec.job_id)  # a rebuild of the budget windows from here on counts this attempt in flight

    # 13. The container: the only step that spends. A cancel that arrived during the gates stops it here.
    if cancel.is_cancel_requested(spec.job_id, redis):
        reservation.give_back(redis)
        return Verdict.refused("operator-cancel")
    attempt.passed("job-caps")
    container_started = time.perf_counter()
    attempt.spending = True
    egress = gateway.EgressGateway(
        job_id=spec.job_id, upstream=upstream, key=credential[1], allow=parse_allowlist(settings.PI_EGRESS_ALLOW),
        limits=limits, redis=redis, owner=user,
        on_stop=lambda reason: container.stop_job_container(spec.job_id),
    )
    try:
        egress.start()
    except gateway.GatewayUnavailable as exc:
        logger.error("egress_gateway_unavailable job=%s why=%s", spec.job_id, exc)
        reservation.give_back(redis)
        return Verdict.infrastructure_fault("egress-gateway-unavailable")
    for each in watches:
        each.start()
    attempt.passed("container")
    ticker = _progress_ticker(attempt, egress, [credential[1], *secret_values.values()])
    attempt.container_ran = True
    memory, cpus = container_size(rows, runtime)
    attempt.limits = (user, memory, cpus)
    try:
        result = container.run_container(
            client,
            job_id=spec.job_id,
            host=attempt.host,
            image=attempt.image,
            job_dir=dirs.job,
            workspace=dirs.workspace,
            environment=container_environment(spec, runtime, provider,
                                              {**egress.container_environment(), **overlay.environment()},
                                              secret_values, served),
            timeout_seconds=settings.PI_JOB_TIMEOUT_SECONDS,
            user=user,
            memory=memory,
            cpus=cpus,
            egress_mounts=egress.mounts(),
            overlay_mounts=overlay.mounts(),
            log_bytes=settings.PI_JOB_LOG_MAX_BYTES if settings.PI_CAPTURE_JOB_LOGS else 0,
            session_folder=resume.folder if resume is not None else None,
            outbox=dirs.outbox,
        )
    except container.ImageMissing:
        attempt.container_ran = False
        reservation.give_back(redis)
        return Verdict.refused("job-image-missing")
    except container.NeverStarted:
        attempt.container_ran = False
        reservation.give_back(redis)
        return Verdict.infrastructure_fault("container-never-started")
    except container.EngineUnavailable:
        return Verdict.infrastructure_fault("docker-unavailable", budget_reserved=True)
    finally:
        for each in watches:
            each.close()
        if ticker is not None:
            ticker.close()
        egress.close()
    container_seconds = time.perf_counter() - container_started
    logger.info("job_phases job=%s gates_ms=%.1f workspace_ms=%.1f container_ms=%.1f", spec.job_id,
                (container_started - attempt.clock - attempt.workspace_seconds) * 1000,
                attempt.workspace_seconds * 1000, container_seconds * 1000)
    verdict = classify(result, egress.report, runtime)
    # The watch's last look, once the container has ended: what it wrote since the last sample counts too.
    exceeded = any(each.exceeded for each in watches)
    if exceeded or any(each.over_limit() for each in watches):
        verdict = Verdict.refused("workspace-too-large", exit_code=verdict.exit_code, telemetry=verdict.telemetry,
                                  budget_reserved=True)
    # The container has ended: from here a Redis fault must not turn its outcome into a retry (which would
    # run the agent again). What cannot be settled now is logged; the counters' TTLs bound the drift.
    if _cancelled_after_run(spec.job_id, redis):
        # The operator stopped it: whatever the exit code says, the run ends as their decision.
        verdict = Verdict.refused("operator-cancel", exit_code=verdict.exit_code,
                                  telemetry=verdict.telemetry, budget_reserved=True)
    try:
        if not verdict.budget_reserved:
            reservation.give_back(redis)  # nothing ran, so nothing was spent
        # The dollar hold: charged what the gateway metered, unless that cannot be the whole cost (a run stopped
        # from outside may have had a call cut mid-answer): then the whole hold stays (floor).
        killed = result.timed_out or exceeded or verdict.reason in ("operator-cancel", "oom-killed")
        attempt.container_ran = verdict.budget_reserved
        budget.settle_dollars(redis, attempt.dollars, ran=verdict.budget_reserved,
                              cost=None if killed else egress.report.meter.known_cost())
        # The gateway counted its tokens into the day as they were spent; what it could not is settled here.
        unmetered = 0 if egress.report.meter.metered else (verdict.telemetry.tokens_total or 0)
        budget.record_tokens(redis, unmetered + egress.unrecorded_tokens, now)
    except RedisError:
        logger.warning("job_post_run_redis_failed job=%s", spec.job_id)

    # The agent's summary is kept only with its run's log (PI_CAPTURE_JOB_LOGS), scrubbed like it.
    summary = parse_summary(result.output_tail)
    forge_tokens = publishing.forge_tokens(attempt.forge) if attempt.forge is not None else []
    scrub = [credential[1], *forge_tokens, *secret_values.values()]
    verdict = replace(verdict, summary=summary, log=run_logs.captured(result.log, summary, scrub))
    if resume is not None:
        # Kept only when the run completed; any other end leaves the target's earlier session as it was.
        if verdict.outcome == Outcome.COMPLETED:
            resume = sessions.promote(resume, spec, attempt.host, scrub, now=timezone.now())
        verdict = replace(verdict, session=resume.record_fields())

    # 14. Publish: the worker, not the agent, takes the work to the forge (never a credential in what it posts).
    if verdict.outcome == Outcome.COMPLETED and attempt.forge is not None:
        attempt.passed("publishing")
        # A cron job's folder on GitHub is published as a job on that repository (folder_forge.py says how).
        published_as = replace(spec, kind="github", repo=attempt.forge.repo) \
            if isinstance(attempt.forge, folder_forge.FolderOnGitHub) else spec
        publication, reason = publishing.publish_run(published_as, attempt.forge, dirs.root, dirs.workspace,
                                                     summary, result.ended_at,
                                                     credentials={credential[0]: credential[1]},
                                                     job_secrets=secret_values)
        verdict = replace(verdict, publication=publication)
        if reason == publishing.UNAVAILABLE:
            verdict = replace(verdict, outcome=Outcome.FAILED, reason=reason, retryable=False)
        elif reason:
            verdict = replace(verdict, outcome=Outcome.POLICY, reason=reason)

    # Chaining: only a completed run's requests are read, once (its record names the children).
    if verdict.outcome == Outcome.COMPLETED:
        chain = chaining.collect(spec, dirs.outbox, attempt.chainable, attempt.chain_pi_tree)
        verdict = replace(verdict, chain_children=chain.children, chain_refusals=chain.refusals)
    return verdict
