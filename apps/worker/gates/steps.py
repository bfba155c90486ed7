"""The gates before the container, one function each, in `ladder.GATES`' order. Each reads what the gates before it
found on the attempt and adds what it finds; it ends the climb only by raising a GateStop (refusal, fault or
deferral), and whatever it takes it hands to the attempt to hold.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.fleet import cancel, registry
from apps.fleet.queues import SHARED_QUEUE
from apps.worker import accepted, allowed_models
from apps.worker.chaining import service as chaining
from apps.worker.chaining import skills as chain_skills
from apps.worker.forges import ForgeFailure
from apps.worker.gates import (
    budget,
    budget_rebuild,
    host_budget,
    host_slots,
    leases,
    quiet_hours,
    runtime_settings,
    secrets,
    waitfor,
)
from apps.worker.gates.attempt import Attempt
from apps.worker.gates.scopes import job_scopes, normalise_folder, scope_hash
from apps.worker.gates.verdicts import GateDeferral, GateFault, GateRefusal
from apps.worker.jobs import FORGE_KINDS, JobSpec, job_time_budget_seconds
from apps.worker.models import PauseWindow, Run
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
    venues,
    workspace_volume,
)
from apps.worker.sandbox.workspace import WorkspaceRefused, check_local_folder
from apps.worker.sessions import store as sessions

logger = logging.getLogger("pidispatch.ladder")

REBUILD_RECHECK_SECONDS = 2  # a job arriving while another process rebuilds the budget windows looks again then


def cancelled_before_start(attempt: Attempt) -> None:
    """1. An operator cancelled it while it was on its way to this worker."""
    if cancel.is_cancel_requested(attempt.spec.job_id, attempt.redis):
        raise GateRefusal("operator-cancel")


def quiet_hours_gate(attempt: Attempt) -> None:
    """2. Quiet hours: the latest end of the pause windows over the job's scopes."""
    now = attempt.now
    until = quiet_hours.paused_until(PauseWindow.objects.filter(enabled=True), job_scopes(attempt.spec), now)
    if until is not None and until > now + timedelta(seconds=1):
        raise GateDeferral(until, "pause-window", {"windowEnds": until.isoformat()})


def wait_for(attempt: Attempt) -> None:
    """3. `run.waitFor`: an instant and/or check scripts."""
    waited = waitfor.gate(attempt.redis, attempt.spec, attempt.now)
    if waited.refuse:
        raise GateRefusal(waited.refuse)
    if waited.defer_until is not None:
        raise GateDeferral(waited.defer_until, waited.reason, waited.detail or {})


def slots(attempt: Attempt) -> None:
    """4. The host's slot (PI_CONCURRENCY), a forge scope's concurrency (fleet-wide) and the local-folder mutex (per
    host). A folder's path names no repository across hosts (`/srv/site` on two hosts is two repositories sharing a
    layout), so a local scope never takes a fleet-wide slot: its folder mutex, one job per folder on its host, is
    already as narrow as any `concurrent` it could have."""
    spec = attempt.spec
    host_slots.take(attempt.redis, attempt)
    rows = attempt.rows = budget.rows_for(spec)
    wanted = []
    if spec.kind == "local":
        wanted.append((f"f:{attempt.host}:{scope_hash(normalise_folder(spec.folder))}", 1))
    elif rows.scope is not None and rows.scope.concurrent:
        wanted.append((f"s:{scope_hash(rows.scope.scope)}", rows.scope.concurrent))
    if rows.project is not None and rows.project.concurrent:
        # A project's runs at once, fleet-wide, local members too (taken after the narrower slot).
        wanted.append((f"s:{scope_hash(rows.project.scope)}", rows.project.concurrent))
    for name, count in wanted:
        lease = leases.acquire(attempt.redis, name, count, attempt.holder, job_time_budget_seconds())
        if lease is None:
            recheck = attempt.now + timedelta(seconds=settings.PI_SCOPE_BUSY_RECHECK_SECONDS)
            raise GateDeferral(recheck, "scope-busy", {"slots": count})
        attempt.hold_lease(lease)


def settings_overlay(attempt: Attempt) -> None:
    """5. Settings: the DB row over the environment."""
    try:
        attempt.runtime = runtime_settings.current()
    except runtime_settings.SettingsInvalid as exc:
        logger.error("settings_overlay_invalid job=%s detail=%s", attempt.spec.job_id, exc)
        raise GateRefusal("settings-overlay-invalid") from None


def host_budget_gate(attempt: Attempt) -> None:
    """5b. The host budget (apps/worker/gates/host_budget.py): the job's size, admitted when it fits beside what runs
    here and the holds ranked above it, within its project's share; deferred while it could fit later, refused when
    it never can."""
    spec, project = attempt.spec, attempt.rows.project
    size = attempt.job_size = host_budget.job_size(project, attempt.runtime)
    try:
        budget = host_budget.current()
    except container.EngineUnavailable:
        raise GateFault("docker-unavailable") from None
    share = project.host_share if project is not None else None
    if not budget.holds(size):
        _too_big_for_this_host(attempt, size)
    if not budget.share_holds(size, share):
        raise GateRefusal("job-size-exceeds-share")
    decision = host_budget.decide(
        attempt.redis, attempt.host, job_id=spec.job_id, holder=attempt.holder, size=size, project=spec.project,
        min_jobs=project.min_jobs if project is not None else None, budget=budget, share_percent=share)
    if not decision.admitted:
        raise GateDeferral(host_budget.recheck_at(attempt.now), "host-budget",
                           {"waitsFor": decision.bound, "holdsAhead": decision.ahead})
    attempt.hold_host_budget()


def _too_big_for_this_host(attempt: Attempt, size: host_budget.JobSize) -> None:
    """A job this host's budget can never hold. A forge job from the shared queue may suit another host: deferred
    while a live host's budget holds it, refused `job-size-exceeds-fleet` once two registry reads apart agree none
    does. Anything else (a local job, a job on this host's own queue) is refused at once."""
    spec = attempt.spec
    if spec.kind not in FORGE_KINDS or attempt.queue != SHARED_QUEUE:
        raise GateRefusal("job-size-exceeds-host")
    confirm = settings.PI_FLEET_FIT_CONFIRM_SECONDS
    try:
        elsewhere = any(row.routes and row.holds(size.memory_mib, size.cpu_centi)
                        for row in registry.read_hosts(attempt.redis, processes=False))
    except registry.RegistryUnreadable:
        elsewhere = True  # it cannot be told: another read later
    if elsewhere:
        attempt.redis.delete(host_budget.fleet_key(spec.job_id))
        raise GateDeferral(attempt.now + timedelta(seconds=confirm), "host-too-small", {})
    first = host_budget.fleet_none_since(attempt.redis, spec.job_id, attempt.now.timestamp())
    if attempt.now.timestamp() - first >= confirm:
        raise GateRefusal("job-size-exceeds-fleet")
    raise GateDeferral(attempt.now + timedelta(seconds=confirm), "host-too-small", {})


def once_spent(attempt: Attempt) -> None:
    """6. A one-shot rule already spent by another job since it was (re-)armed."""
    spec = attempt.spec
    if spec.once and spec.trigger_id is not None:
        armed = datetime.fromisoformat(spec.once_armed_at) if spec.once_armed_at else None
        if Run.objects.spent_by_trigger(spec.trigger_id, other_than=spec.job_id, since=armed):
            raise GateRefusal("once-already-spent")


def venue(attempt: Attempt) -> None:
    """6b. The venue: one this host's environment blesses, and one this worker can run."""
    spec = attempt.spec
    refused = venues.refusal(spec.backend)
    if refused is not None:
        reason, why = refused
        logger.info("backend_refused job=%s backend=%s reason=%s why=%s", spec.job_id, spec.backend or venues.DEFAULT,
                    reason, why)
        raise GateRefusal(reason)


def image(attempt: Attempt) -> None:
    """7. The image, never pulled."""
    try:
        attempt.engine = container.engine()
        attempt.image_id = container.preflight_image(attempt.engine, attempt.image)
    except container.ImageMissing:
        raise GateRefusal("job-image-missing") from None
    except container.ImageIncompatible as incompatible:
        logger.error("job_image_refused job=%s image=%s reason=%s", attempt.spec.job_id, attempt.image,
                     incompatible.reason)
        raise GateRefusal(incompatible.reason) from None
    except container.EngineUnavailable:
        raise GateFault("docker-unavailable") from None


def provider(attempt: Attempt) -> None:
    """8. The provider: a key on this worker and an upstream its gateway can serve (and meter)."""
    spec = attempt.spec
    name = attempt.provider = spec.provider or settings.PI_PROVIDER
    attempt.credential, attempt.upstream = providers.credential(name), providers.upstream(name)
    if attempt.credential is None or attempt.upstream is None:
        logger.error("provider_unconfigured job=%s provider=%s variable=%s upstream=%s", spec.job_id, name,
                     providers.key_variable(name) or "-", "unknown" if attempt.upstream is None else "ok")
        raise GateRefusal("provider-unconfigured")


def allowed_model_list(attempt: Attempt) -> None:
    """8b. The allowed-model list (the trigger's run.models, else PI_ALLOWED_MODELS): its entries of the job's
    provider."""
    attempt.served = served_models(attempt.spec, attempt.provider)


def job_secrets(attempt: Attempt) -> None:
    """9. The job's secrets, resolved on this host (before the workspace: nothing costly for a job refused here)."""
    try:
        attempt.secret_values = secrets.resolve(attempt.spec)
    except secrets.SecretsRefused as refused:
        raise GateRefusal(refused.reason) from None
    except secrets.ResolverUnreachable:
        raise GateFault("secret-resolver-unreachable") from None


def workspace(attempt: Attempt) -> None:
    """10. The workspace: a local job's folder as it is; a forge job's fresh clone, made with its own token. Then
    the job's files, and the workspace's size, measured again while the container runs."""
    spec = attempt.spec
    attempt.user = container.job_user()
    cron = _local_workspace(attempt) if spec.kind == "local" else None
    dirs = jobfiles.prepare(spec, settings.PI_JOB_ROOT, owner=attempt.user, workspace=attempt.workspace_folder,
                            cron=cron, outbox=chaining.enabled_for(spec))
    attempt.hold_dirs(dirs)
    agent_config.write(dirs.job, attempt.upstream, job_model(spec), attempt.served)
    # The operator's overlay, the trigger's skills folder, and the settings.json that makes pi load them.
    attempt.overlay = _refused_workspace(pi_overlay.prepare, dirs.job, packages=spec.packages,
                                         skills_dir=spec.skills_dir, job_id=spec.job_id)
    if spec.kind in FORGE_KINDS:
        _forge_workspace(attempt)
    if spec.parent_job_id or chaining.may_have_children(spec):
        # A chain runs on the `.pi/` its first job started on: no agent of the chain rewrites the skills, or the
        # chainable flows, of the jobs after it (its parent's commits are in a child's workspace).
        found = chain_skills.pi_digest(attempt.workspace_folder or dirs.workspace)
        if spec.parent_job_id and found != spec.chain_pi_tree:
            logger.warning("chain_pi_changed job=%s parent=%s", spec.job_id, spec.parent_job_id)
            raise GateRefusal("chain-pi-changed")
        attempt.chain_pi_tree = found
    watch = _watch(spec, dirs.workspace, counts_whole=attempt.workspace_folder is None)
    if watch.over_limit():
        raise GateRefusal("workspace-too-large")
    attempt.watches.append(watch)
    if dirs.outbox is not None:  # the outbox is the host's disk too: held to the same bounds, counted whole
        attempt.watches.append(_watch(spec, dirs.outbox))


def session(attempt: Attempt) -> None:
    """10b. `run.resume`: the target's kept session, copied into the job's folder beside its workspace (the forge
    said whether a pull request comes from a fork; a store fault only runs the job cold). The container may write
    it: it is held to the workspace's bounds, measured the same way."""
    spec = attempt.spec  # only a `run.resume` job climbs this gate (its `when` in ladder.GATES)
    attempt.resume = sessions.checkout(spec, attempt.dirs.root, owner=attempt.user, now=timezone.now(),
                                       pull=attempt.forge.pull if attempt.forge is not None else None)
    if attempt.resume.folder is not None:
        attempt.watches.append(_watch(spec, attempt.resume.folder))


def budget_windows(attempt: Attempt) -> None:
    """10c. A Redis that lost its data (or came back from an older copy) gets its budget windows back from the run
    records before any job is admitted: no cap is passed because Redis forgot (gates/budget_rebuild.py)."""
    try:
        budget_rebuild.ensure_rebuilt(attempt.redis, attempt.now)
    except budget_rebuild.Rebuilding:
        raise GateDeferral(timezone.now() + timedelta(seconds=REBUILD_RECHECK_SECONDS), "budget-rebuilding") from None


def daily_tokens(attempt: Attempt) -> None:
    """11. The daily token cap (checked before, recorded after: it may overshoot by the runs in flight)."""
    cap = attempt.runtime.daily_token_cap
    if cap and budget.tokens_spent_today(attempt.redis, attempt.now) >= cap:
        raise GateRefusal("daily-token-cap")


def dollar_windows(attempt: Attempt) -> None:
    """11b. The dollar windows: the job's per-job cap held in each, in one atomic step (none when one has no room)."""
    spec, rows = attempt.spec, attempt.rows
    try:
        hold = budget.reserve_dollars(attempt.redis, spec, rows.calling(job_models(spec, attempt.upstream,
                                                                                   attempt.served)),
                                      attempt.runtime, attempt.now)
    except budget.DollarRefusal as refusal:
        window = refusal.window
        logger.info("dollar_refused job=%s reason=%s ledger=%s window=%s", spec.job_id, refusal.reason,
                    window.ledger if window else "-", window.window if window else "-")
        if refusal.reason == "cost-cap-unset":
            logger.error("dollar_cap_unset job=%s ledger=%s set=PI_MAX_COST_USD,max_cost_usd,run.maxCostUsd "
                         "why=a scoped limit's dollar window needs a per-job cap", spec.job_id, window.ledger)
        by_limit = rows.scope.pk if rows.scope is not None and window is not None and window.ledger != "all" else None
        raise GateRefusal(refusal.reason, refused_by_limit_id=by_limit) from None
    attempt.hold_dollars(hold)


def model_prices(attempt: Attempt) -> None:
    """11c. A model the job names exactly, and every model on its allowed list, must have a price when a dollar cap
    applies (the gateway refuses their calls otherwise; refused here, before any spend)."""
    spec, upstream = attempt.spec, attempt.upstream
    limits = attempt.gateway_limits = gateway_limits(spec, upstream, attempt.runtime, attempt.dollars.cap_micros,
                                                     attempt.served)
    callable_models = list(attempt.served) or ([limits.model] if limits.model else [])
    if limits.max_cost_micros is not None and any(prices.price(upstream.provider, each.lower()) is None
                                                  for each in callable_models):
        logger.info("model_unpriced job=%s provider=%s", spec.job_id, upstream.provider)
        raise GateRefusal("model-unpriced")


def job_counts(attempt: Attempt) -> None:
    """12. Job-count caps, narrowest first."""
    spec = attempt.spec
    try:
        attempt.hold_reservation(budget.reserve(attempt.redis, attempt.rows, attempt.runtime, attempt.now))
    except budget.CapRefusal as refusal:
        attempt.refused_counted = refusal.counted
        logger.info("cap_refused job=%s reason=%s window=%s", spec.job_id, refusal.reason, refusal.window)
        if refusal.reason == "soft-hold":
            period = budget.window_keys("all", attempt.now)[refusal.window].rsplit(":", 1)[-1]
            budget.soft_hold_reached.send_robust(sender=budget.CapRefusal, window=refusal.window, period=period,
                                                 job_id=spec.job_id)
        scope = attempt.rows.scope
        by_limit = scope.pk if refusal.reason == "scope-cap" and scope is not None else None
        raise GateRefusal(refusal.reason, budget_reserved=refusal.budget_reserved,
                          refused_by_limit_id=by_limit) from None
    accepted.spending(spec.job_id)  # a rebuild of the budget windows from here on counts this attempt in flight


def cancelled_before_container(attempt: Attempt) -> None:
    """12b. A cancel that arrived during the gates stops the job before anything spends."""
    cancelled_before_start(attempt)


# --- what the gates above share with the container's step


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


def gateway_limits(spec: JobSpec, upstream: providers.Upstream, runtime: runtime_settings.RuntimeSettings,
                   max_cost_micros: int | None = None, allowed: tuple[str, ...] = ()):
    """The job's token budget, the day's cap and its dollar cap. With an allowed-model list the gateway forwards
    the listed models of the job's provider (`allowed`) and no other; without one, the model is held to only when
    it names one exactly (pi also takes fuzzy patterns like `sonnet`, which the gateway cannot tell apart from
    another model)."""
    return gateway.Limits(max_tokens=runtime.max_tokens, daily_token_cap=runtime.daily_token_cap,
                          model="" if allowed else held_model(spec, upstream), max_cost_micros=max_cost_micros,
                          allowed_models=frozenset(each.lower() for each in allowed))


def served_models(spec: JobSpec, provider: str) -> tuple[str, ...]:
    """The job's provider's models on its allowed-model list (() when there is no list). Refused: a list that cannot
    be read, a main model off it, or no model of the job's provider on it (its gateway serves that provider only, so
    nothing could be called)."""
    try:
        listed = allowed_models.effective(allowed_models.check(spec.models, "run.models") if spec.models else ())
    except allowed_models.ModelListError:
        logger.error("allowed_models_invalid job=%s source=%s", spec.job_id,
                     "job" if spec.models else "PI_ALLOWED_MODELS")
        raise GateRefusal("job-payload-invalid" if spec.models else "model-not-allowed") from None
    if not listed:
        return ()
    model = job_model(spec)
    if model and not allowed_models.is_listed(listed, provider, model):
        logger.info("model_not_allowed job=%s provider=%s why=main-model-unlisted", spec.job_id, provider)
        raise GateRefusal("model-not-allowed")
    served = allowed_models.for_provider(listed, provider)
    if not served:
        logger.info("model_not_allowed job=%s provider=%s why=no-listed-model-of-provider", spec.job_id, provider)
        raise GateRefusal("model-not-allowed")
    return served


def _local_workspace(attempt: Attempt) -> dict | None:
    """A local job's folder as it is (and, for a cron job's `run.github`, its GitHub repository); its cron document."""
    spec = attempt.spec
    started = time.perf_counter()
    local = attempt.local = _refused_workspace(check_local_folder, spec.folder, force=spec.force, job_id=spec.job_id)
    attempt.workspace_seconds = time.perf_counter() - started
    attempt.user = local.owner
    if spec.github:  # a cron job whose work the worker publishes to its folder's GitHub repository
        try:
            attempt.hold_forge(_refused_workspace(folder_forge.prepare, local.folder, local.head, job_id=spec.job_id))
        except ForgeFailure as failure:
            logger.warning("workspace_forge_fault job=%s reason=%s", spec.job_id, failure.reason)
            raise (GateFault if failure.transient else GateRefusal)(failure.reason) from None
    if chaining.may_have_children(spec):
        attempt.chainable = chain_skills.chainable_in_folder(local.folder, local.owner, spec.job_id)
    if spec.trigger_type != "cron":
        return None
    previous = Run.objects.previous_cron_run_at(spec.job_id, spec.trigger_id)
    return jobfiles.cron_document(spec, local.head, previous)


def _forge_workspace(attempt: Attempt) -> None:
    """A forge job's fresh clone, made with its own token (a transient forge error is retried, waiting as the forge
    said)."""
    spec = attempt.spec
    started = time.perf_counter()
    try:
        attempt.hold_forge(_refused_workspace(forge_workspace.prepare, spec, attempt.dirs, owner=attempt.user,
                                              job_id=spec.job_id))
    except ForgeFailure as failure:
        if failure.transient and workspace_volume.is_full(attempt.dirs.workspace):
            logger.info("workspace_refused job=%s reason=workspace-too-large why=clone-filled-volume", spec.job_id)
            raise GateRefusal("workspace-too-large") from None
        if failure.transient:
            logger.warning("workspace_forge_fault job=%s reason=%s retry_after=%s", spec.job_id, failure.reason,
                           failure.retry_after if failure.retry_after is not None else "-")
            raise GateFault(failure.reason, retry_after_seconds=failure.retry_after or 0) from None
        logger.info("workspace_refused job=%s reason=%s", spec.job_id, failure.reason)
        raise GateRefusal(failure.reason, forge_message=failure.forge_message) from None
    attempt.workspace_seconds = time.perf_counter() - started
    if chaining.may_have_children(spec):
        attempt.chainable = chain_skills.chainable_in_job_folder(attempt.dirs.job)


def _refused_workspace(prepare, *args, job_id: str, **kwargs):
    """`prepare(*args, **kwargs)`, its WorkspaceRefused a refusal of the job."""
    try:
        return prepare(*args, **kwargs)
    except WorkspaceRefused as refused:
        logger.info("workspace_refused job=%s reason=%s", job_id, refused.reason)
        raise GateRefusal(refused.reason) from None


def _watch(spec: JobSpec, folder, *, counts_whole: bool = True) -> disk.WorkspaceWatch:
    return disk.WorkspaceWatch(spec.job_id, folder, counts_whole=counts_whole,
                               on_exceeded=lambda: container.stop_job_container(spec.job_id))
