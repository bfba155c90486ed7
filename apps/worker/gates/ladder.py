"""The gate ladder: free checks before costly ones, budget before tokens, and the container last. `GATES` below is
the one statement of the order; each gate's step lets the job climb on or raises a GateStop (verdicts.py) that
defers it (back to the scheduled registry, no attempt, no record), refuses it (`policy`, never retried) or ends
the attempt as a fault (`failed`, retried). What a step takes, the attempt holds and gives back on every way out.

The order: 1 cancelled before start, 2 quiet hours, 3 wait-for, 4 host and scope slots, 5 settings overlay,
5b host budget, 6 one-shot spent, 6b venue, 7 image preflight, 8 provider credential, 8b allowed models,
9 secrets, 10 workspace, 10b session, 10c budget windows, 11 daily token cap, 11b dollar windows, 11c model
prices, 12 job-count caps, 12b cancelled before the container, 13 container, 14 publish, 14b chaining.
Each gate's module, the reasons it can end a job with and what it defers for: docs/architecture.md, "The gate
ladder" (a test holds the three to this table).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from redis.exceptions import RedisError

from apps.fleet.connection import get_redis
from apps.worker.gates import container_step, steps
from apps.worker.gates.attempt import Attempt
from apps.worker.gates.verdicts import Deferred, GateStop, Verdict, database_unavailable
from apps.worker.jobs import JobSpec
from apps.worker.models import PauseWindow, Run
from apps.worker.progress.tracker import Progress
from apps.worker.sandbox import disk

logger = logging.getLogger("pidispatch.ladder")


@dataclass(frozen=True)
class Gate:
    """One rung: its number (as the documentation names it), what it checks, its step, and every reason token it can
    end a climb with. `phase` is the live page's token for it (`phase_label` its words): written once the gate is
    passed, or as it starts for a gate that takes long (`announced`). A gate with `when` runs only when that holds."""

    number: str
    name: str
    step: Callable[[Attempt], None]
    phase: str = ""
    phase_label: str = ""
    announced: bool = False
    when: Callable[[Attempt], bool] | None = None
    defers: tuple[str, ...] = ()
    refuses: tuple[str, ...] = ()  # `policy`; a token ending in `*` stands for a family (`pi-*`)
    retries: tuple[str, ...] = ()  # `failed`, retried

    def ends_with(self, reason: str) -> bool:
        return any(reason == token or (token.endswith("*") and reason.startswith(token[:-1]))
                   for token in (*self.defers, *self.refuses, *self.retries))


GATES: tuple[Gate, ...] = (
    Gate("1", "cancelled before start", steps.cancelled_before_start, refuses=("operator-cancel",)),
    Gate("2", "quiet hours", steps.quiet_hours_gate, phase="quiet-hours", phase_label="gate: quiet hours",
         defers=("pause-window",)),
    Gate("3", "wait-for", steps.wait_for, phase="wait-for", phase_label="gate: wait-for",
         defers=("wait-for", "wait-throttled"),
         refuses=("wait-unreadable", "wait-profile-unknown", "wait-after-beyond-max", "wait-superseded",
                  "wait-refused", "wait-expired", "wait-unanswerable")),
    Gate("4", "host and scope slots", steps.slots, phase="slots", phase_label="gate: host and scope slots",
         defers=("host-busy", "scope-busy")),
    Gate("5", "settings overlay", steps.settings_overlay, refuses=("settings-overlay-invalid",)),
    Gate("5b", "host budget", steps.host_budget_gate, phase="host-budget", phase_label="gate: host budget",
         defers=("host-budget", "host-too-small"),
         refuses=("job-size-exceeds-host", "job-size-exceeds-share", "job-size-exceeds-fleet"),
         retries=("docker-unavailable",)),
    Gate("6", "one-shot spent", steps.once_spent, refuses=("once-already-spent",)),
    Gate("6b", "venue", steps.venue, phase="settings", phase_label="gate: settings and one-shot",
         refuses=("backend-unblessed", "backend-unavailable")),
    Gate("7", "image preflight", steps.image, phase="image", phase_label="gate: job image",
         refuses=("job-image-missing", "job-image-unlabelled", "job-image-protocol-mismatch"),
         retries=("docker-unavailable",)),
    Gate("8", "provider credential", steps.provider, refuses=("provider-unconfigured",)),
    Gate("8b", "allowed models", steps.allowed_model_list, refuses=("model-not-allowed", "job-payload-invalid")),
    Gate("9", "secrets", steps.job_secrets, phase="provider-and-secrets",
         phase_label="gate: provider key and secrets",
         refuses=("secret-name-reserved", "secret-profile-unknown", "secret-profile-ambiguous", "secret-unresolved"),
         retries=("secret-resolver-unreachable",)),
    Gate("10", "workspace", steps.workspace, phase="workspace", phase_label="workspace ready",
         refuses=("folder-not-allowed", "workspace-missing", "workspace-not-a-repo", "workspace-no-commit",
                  "workspace-dirty", "workspace-config-unsafe", "job-user-unmappable", "unprotected-branch",
                  "sha-gone", "pull-request-closed", "pull-request-missing", "default-branch-missing",
                  "forge-auth-refused", "forge-repo-not-found", "pi-*", "forge-*", "workspace-too-large",
                  "skills-dir-*", "fork-unavailable", "chain-pi-changed", "github-remote-missing",
                  "github-remote-mismatch", "github-start-unpublished"),
         retries=("clone-failed", "clone-timeout", "forge-unavailable", "forge-*", "fork-not-ready", "git-unavailable",
                  "disk-full")),
    Gate("10b", "session", steps.session, when=lambda attempt: attempt.spec.resume),
    Gate("10c", "budget windows", steps.budget_windows, defers=("budget-rebuilding",)),
    Gate("11", "daily token cap", steps.daily_tokens, refuses=("daily-token-cap",)),
    Gate("11b", "dollar windows", steps.dollar_windows, refuses=("dollar-cap", "cost-cap-unset")),
    Gate("11c", "model prices", steps.model_prices, phase="spend-caps", phase_label="gate: token and dollar caps",
         refuses=("model-unpriced",)),
    Gate("12", "job-count caps", steps.job_counts, phase="job-caps", phase_label="gate: job-count caps",
         refuses=("scope-cap", "project-cap", "over-budget", "soft-hold")),
    Gate("12b", "cancelled before the container", steps.cancelled_before_container, refuses=("operator-cancel",)),
    Gate("13", "container", container_step.run_in_container, phase="container", phase_label="container running",
         announced=True,
         refuses=("token-budget", "daily-token-cap", "cost-cap", "model-not-allowed", "model-unpriced",
                  "request-malformed", "usage-unreadable", "worker-abort", "runner-policy", "provider-auth-refused",
                  "oom-killed", "egress-denied", "workspace-too-large", "operator-cancel", "job-image-missing"),
         retries=("egress-gateway-unavailable", "container-never-started", "runner-infra", "container-exit-unknown",
                  "docker-unavailable")),
    Gate("14", "publish", container_step.publish, phase="publishing", phase_label="publishing to the forge",
         announced=True, when=container_step.completed_forge_run,
         refuses=("summary-held-secret", "secret-in-work", "ci-change-refused", "push-too-many-files", "push-too-large",
                  "file-too-large", "symlink-escapes", "submodule-change-refused", "push-refused", "forge-auth-refused",
                  "forge-repo-not-found", "work-unreadable", "work-config-unsafe", "work-nested-repository",
                  "workspace-repo-unsafe", "work-too-large", "forge-*")),
    Gate("14b", "chaining", container_step.chain, when=container_step.completed),
)


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


def run(spec: JobSpec, host: str, progress: Progress | None = None, queue: str = "") -> Verdict | Deferred:
    """Climb the ladder for one attempt of `spec` (taken from `queue`) on `host`. The faults no step catches are told
    apart here, once: Redis (retried), the database before any spend (deferred) and a full disk while the job is
    prepared (retried)."""
    attempt = Attempt(spec=spec, host=host, now=timezone.now(), redis=get_redis(),
                      image=spec.image or settings.PI_JOB_IMAGE, progress=progress, queue=queue)
    outcome = None
    try:
        outcome = _climb(attempt)
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
        attempt.ended(outcome)
    if isinstance(outcome, Deferred):
        logger.info("job_deferred job=%s reason=%s until=%s", spec.job_id, outcome.reason, outcome.until.isoformat())
        return outcome
    dollars = attempt.dollars.record_fields() if attempt.dollars is not None else {}
    return replace(outcome, image=attempt.image, started_at=attempt.now, ended_at=timezone.now(), dollars=dollars,
                   ledgers=attempt.ledgers(), sandbox_until=attempt.sandbox_until,
                   size=attempt.job_size.record_fields() if attempt.job_size is not None else {})


def _climb(attempt: Attempt) -> Verdict | Deferred:
    for gate in GATES:
        if gate.when is not None and not gate.when(attempt):
            continue
        if gate.phase and gate.announced:
            attempt.passed(gate.phase)
        try:
            gate.step(attempt)
        except GateStop as stop:
            if not gate.ends_with(stop.reason):
                logger.error("gate_reason_undeclared job=%s gate=%s reason=%s", attempt.spec.job_id, gate.number,
                             stop.reason)
            return stop.outcome
        if gate.phase and not gate.announced:
            attempt.passed(gate.phase)
    return attempt.verdict
