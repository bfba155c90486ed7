"""What one attempt of a job came to: the ladder produces a Verdict, the record stores it.

Refuse = policy outcome with a reason, never retried. Infrastructure fault = failed outcome, retried
with backoff up to PI_RETRY_ATTEMPTS. A bug in our own code is failed and not retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from apps.worker.models import Outcome
from apps.worker.sandbox.exitline import NO_TELEMETRY, Telemetry


@dataclass(frozen=True)
class Publication:
    """What the publish step did (DESIGN section 8): its outcome token and, when it reached the forge, where."""

    outcome: str
    pull_request: int | None = None
    pushed_commits: int | None = None
    url: str = ""
    changed_files: int | None = None  # paths the agent's work changed (pushed or not)
    forge_message: str = field(default="", repr=False)  # the forge's own words when it refused (ForgeFailure)
    refusal: str = ""  # what the worker found when it refused to push (`secret-in-work`: where, which secret's name)
    # Its paths, commits and bounded diff, for the run page (publishing/changes.py: WorkChanges); None: not read.
    changes: object | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Verdict:
    outcome: str
    reason: str = ""
    exit_code: int | None = None
    telemetry: Telemetry = NO_TELEMETRY
    image: str = ""
    started_at: datetime = field(default_factory=timezone.now)
    ended_at: datetime = field(default_factory=timezone.now)
    budget_reserved: bool = False
    # The ScopedLimit (pk) whose cap refused the job: the record links the operator to it.
    refused_by_limit_id: int | None = None
    retryable: bool = False
    # The agent's own account of its work (the runner's summary line): forge text for the publish step,
    # never recorded or logged.
    summary: str = field(default="", repr=False)
    publication: Publication | None = None
    # The Run record's dollar fields (budget.DollarHold.record_fields), set once the climb let go of its hold.
    dollars: dict = field(default_factory=dict)
    # The Run record's `ledgers`: the budget ledgers the attempt counted in (Attempt.ledgers), for a rebuild.
    ledgers: dict = field(default_factory=dict)
    # The run's scrubbed output and summary (run_logs.CapturedLog), only with PI_CAPTURE_JOB_LOGS.
    log: object | None = field(default=None, repr=False)
    # An attempt whose worker died: whether it runs again (models.LostRetry), set by worker_lost.settle only.
    lost_retry: str = ""
    # `run.resume`: the Run record's session fields (sessions.store.Resume.record_fields), once its container ran.
    session: dict = field(default_factory=dict)
    # Chaining (apps/worker/chaining/): the children a completed run's /outbox asked for, and what was refused.
    chain_children: tuple[str, ...] = ()
    chain_refusals: dict = field(default_factory=dict)
    # Until when the run's folder stays on its host for a sandbox (apps/worker/sandbox/sandboxes.py), else None.
    sandbox_until: datetime | None = None
    # The Run record's size fields (host_budget.JobSize.record_fields), once gate 5b sized the job.
    size: dict = field(default_factory=dict)
    # A forge that said how long to wait (Retry-After, a rate limit's reset): the retry waits at least that long.
    retry_after_seconds: float = 0
    # The forge's own words when it refused a request (ForgeFailure.forge_message), for the run record alone.
    forge_message: str = field(default="", repr=False)

    @classmethod
    def refused(cls, reason: str, **fields) -> Verdict:
        return cls(outcome=Outcome.POLICY, reason=reason, **fields)

    @classmethod
    def infrastructure_fault(cls, reason: str, **fields) -> Verdict:
        return cls(outcome=Outcome.FAILED, reason=reason, retryable=True, **fields)


@dataclass(frozen=True)
class Deferred:
    """Returned by a job to come back later: the same job id goes back to RQ's scheduled registry for
    `until`, uses no attempt and writes no record (the worker class does the rescheduling)."""

    until: datetime
    reason: str  # a token (`pause-window`, `scope-busy`, `wait-for`, ...), never shown to the forge
    # What it waits on, for the operator (ids, names and numbers only: `{"profile": "ci-green", "checks": 3}`).
    detail: dict = field(default_factory=dict)


def database_unavailable() -> Deferred:
    """The database did not answer before the job spent anything: nothing was decided or recorded, so the
    job comes back under its id, no attempt used, until the database answers."""
    return Deferred(timezone.now() + timedelta(seconds=settings.PI_DATABASE_RECHECK_SECONDS), "database-unavailable")


class GateStop(Exception):
    """A gate's end of the climb, raised by a step of `ladder.GATES` and caught in one place (`ladder._climb`):
    its `outcome` is what the attempt came to. Three kinds, as Read the Docs splits BuildUserError from
    BuildAppError: a refusal (the job's or the operator's doing, never retried), a fault (the host's, retried)
    and a deferral (not now: the same job comes back later)."""

    outcome: Verdict | Deferred

    @property
    def reason(self) -> str:
        return self.outcome.reason


class GateRefusal(GateStop):
    """Outcome `policy`: the job may not run as it is (never retried)."""

    def __init__(self, reason: str, **fields):
        super().__init__(reason)
        self.outcome = Verdict.refused(reason, **fields)


class GateFault(GateStop):
    """Outcome `failed`: something of the host's was not there (retried with backoff)."""

    def __init__(self, reason: str, **fields):
        super().__init__(reason)
        self.outcome = Verdict.infrastructure_fault(reason, **fields)


class GateDeferral(GateStop):
    """Not now: back to the scheduled registry until `until`, no attempt used, no record."""

    def __init__(self, until: datetime, reason: str, detail: dict | None = None):
        super().__init__(reason)
        self.outcome = Deferred(until, reason, detail or {})
