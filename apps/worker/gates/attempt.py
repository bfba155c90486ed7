"""One climb of the gate ladder: the job, what its gates found (typed fields the later gates read), and what it
holds. Whatever a gate takes (a lease, the job's folders, a forge token, the dollar hold, the job-count
reservation, the gateway and the disk watches) it registers with `hold`, and `ended` gives all of it back,
last taken first, on every way out of the climb: no gate gives anything back by hand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from apps.worker.forges.publishing import kept
from apps.worker.gates import budget, host_budget, leases, runtime_settings
from apps.worker.gates.verdicts import Deferred, Verdict
from apps.worker.jobs import JobSpec
from apps.worker.progress.tracker import Progress
from apps.worker.sandbox import disk, forge_workspace, gateway, jobfiles, pi_overlay, providers, sandboxes
from apps.worker.sandbox.container import ContainerExit
from apps.worker.sandbox.workspace import LocalWorkspace
from apps.worker.sessions.store import Resume

logger = logging.getLogger("pidispatch.ladder")


@dataclass(frozen=True)
class ContainerSize:
    """What the container ran with, for a sandbox on its folder afterwards (apps/worker/sandbox/sandboxes.py)."""

    user: tuple[int, int]
    memory: str
    cpus: float


@dataclass
class Attempt:
    spec: JobSpec
    host: str
    now: datetime
    redis: object
    image: str = ""
    queue: str = ""  # the queue it came from (a forge job too big for this host waits for another from the shared one)
    # Where the climb is, for the job's live page (apps/worker/progress/); None when nobody watches (tests in process).
    progress: Progress | None = None
    clock: float = field(default_factory=time.perf_counter)  # for the phase timings in the log

    # What the gates found, in the order they find it.
    rows: budget.MatchedRows | None = None  # gate 4: the job's scoped-limit rows
    runtime: runtime_settings.RuntimeSettings | None = None  # gate 5
    job_size: host_budget.JobSize | None = None  # gate 5b: its size, admitted by the host budget
    engine: object | None = None  # gate 7: the Docker client
    image_id: str = ""  # gate 7: the image the preflight found (a sandbox runs that one, whatever the tag says later)
    provider: str = ""  # gate 8
    credential: tuple[str, str] | None = None  # gate 8: the key's variable and value (never in the container)
    upstream: providers.Upstream | None = None  # gate 8
    served: tuple[str, ...] = ()  # gate 8b: the job's provider's models on its allowed list (() when no list)
    secret_values: dict[str, str] = field(default_factory=dict)  # gate 9
    user: tuple[int, int] | None = None  # gate 10: whom the container runs as
    local: LocalWorkspace | None = None  # gate 10: a local job's folder
    dirs: jobfiles.JobDirs | None = None  # gate 10: the job's folders
    forge: forge_workspace.ForgeWorkspace | None = None  # gate 10: a forge job's clone and token
    overlay: pi_overlay.Overlay | None = None  # gate 10
    workspace_seconds: float = 0.0  # gate 10: of which the workspace (a local folder's git checks; a forge clone)
    chainable: frozenset[str] = frozenset()  # gate 10: flows whose skill allows being chained, read before the agent
    chain_pi_tree: str = ""  # gate 10: the `.pi/` the chain's first job started on (chain_skills.pi_digest)
    watches: list[disk.WorkspaceWatch] = field(default_factory=list)  # gate 10: the workspace, outbox and session
    resume: Resume | None = None  # gate 10b: `run.resume`'s session checkout
    dollars: budget.DollarHold | None = None  # gate 11b
    gateway_limits: gateway.Limits | None = None  # gate 11c
    reservation: budget.Reservation | None = None  # gate 12: the job-count slots
    refused_counted: list[str] = field(default_factory=list)  # gate 12 refused: the windows it still counts in
    size: ContainerSize | None = None  # gate 13
    spending: bool = False  # gate 13, from its gateway's start: it may spend, and a fault no longer sends it back
    result: ContainerExit | None = None  # gate 13
    verdict: Verdict | None = None  # gate 13 on: what the run came to
    scrub: list[str] = field(default_factory=list)  # gate 13: every secret the run's output is scrubbed of

    # How the climb ended, set once by `ended`, read as it lets go.
    spent: bool = False  # its container may have spent: the job-count slot stays taken, an open dollar hold whole
    over_disk: bool = False  # it ended workspace-too-large: its folder is never kept
    sandbox_until: datetime | None = None
    _holds: ExitStack = field(default_factory=ExitStack, repr=False)

    @property
    def holder(self) -> str:
        return leases.holder_id(self.host, self.spec.job_id)

    def passed(self, phase: str) -> None:
        if self.progress is not None:
            self.progress.passed(phase)

    def hold(self, what: str, release: Callable[[], None]) -> None:
        """`release` runs when the climb lets go, whatever it ended in. A release that fails is logged and the rest
        still run: a Redis key it could not delete expires, a token it could not revoke expires within the hour."""

        def guarded() -> None:
            try:
                release()
            except Exception as error:  # its type only: a forge client's message may carry a URL or a token
                logger.warning("attempt_release_failed job=%s hold=%s error=%s", self.spec.job_id, what,
                               type(error).__name__)

        self._holds.callback(guarded)

    def hold_lease(self, lease: leases.Lease) -> None:
        self.hold("lease", lambda: leases.release_all(self.redis, [lease], self.spec.job_id))

    def hold_dollars(self, hold: budget.DollarHold) -> None:
        self.dollars = hold

        def settle() -> None:  # an open hold: refunded when nothing ran, kept whole when its container may have spent
            try:
                budget.settle_dollars(self.redis, hold, ran=self.spent, cost=None)
            except RedisError:
                logger.warning("dollar_settle_failed job=%s kept=hold", self.spec.job_id)
                budget.keep_hold(hold)

        self.hold("dollars", settle)

    def hold_reservation(self, reservation: budget.Reservation) -> None:
        self.reservation = reservation
        self.hold("reservation", lambda: None if self.spent else reservation.give_back(self.redis))

    def hold_dirs(self, dirs: jobfiles.JobDirs) -> None:
        self.dirs = dirs
        self.hold("job-folders", lambda: self._let_go_of_dirs(dirs))

    def hold_forge(self, forge: forge_workspace.ForgeWorkspace) -> None:
        self.forge = forge
        self.hold("forge-token", forge.release)

    def ended(self, outcome: Verdict | Deferred | None) -> None:
        """How the climb ended (None: by an exception), then let go of everything held. Nothing was spent unless the
        gateway was started, and a verdict that says nothing ran (`budget_reserved` false) overrules that."""
        self.spent = self.spending and not (isinstance(outcome, Verdict) and not outcome.budget_reserved)
        self.over_disk = isinstance(outcome, Verdict) and outcome.reason == "workspace-too-large"
        self._holds.close()
        self._leave_the_waiters(outcome)

    def hold_host_budget(self) -> None:
        """Gate 5b let it in: its size counts on the host until the climb ends."""
        self.hold("host-budget", lambda: host_budget.release(self.redis, self.host, self.holder))

    def _leave_the_waiters(self, outcome: Verdict | Deferred | None) -> None:
        """A job that may have waited for the host budget and that another gate holds back now keeps its place in the
        line and gives up its room. (One that ended leaves the line when the next decision finds its RQ job is not
        waiting any more; one admitted left it then.)"""
        if not isinstance(outcome, Deferred) or outcome.reason in host_budget.WAITING_REASONS:
            return
        try:
            host_budget.suspend(self.redis, self.host, self.spec.job_id)
        except RedisError:  # then it keeps its room until it asks again
            logger.warning("host_budget_waiter_kept job=%s", self.spec.job_id)

    def ledgers(self) -> dict:
        """Where this attempt counted (job-count and dollar ledgers), for its run record: the budget windows are
        rebuilt from the run records when Redis lost them (budget_rebuild.py)."""
        counted = self.reservation.keys if self.reservation is not None else self.refused_counted
        held = self.dollars.keys if self.dollars is not None else []
        if not counted and not held:
            return {}
        return {"jobs": budget.ledgers_of(counted), "usd": budget.ledgers_of(held)}

    def _let_go_of_dirs(self, dirs: jobfiles.JobDirs) -> None:
        """Kept for a sandbox when the container ran, kept whole for debugging, stripped to the unpublished work, or
        removed. A workspace past its disk bound is never kept: removed at once, whatever the settings keep."""
        if self.over_disk:
            logger.info("job_folder_removed job=%s why=workspace-too-large", self.spec.job_id)
            jobfiles.remove(dirs)
            return
        if self.spent and self.size is not None:
            self.sandbox_until = sandboxes.retain(
                dirs, job_id=self.spec.job_id, image=self.image_id or self.image, user=self.size.user,
                memory=self.size.memory, cpus=self.size.cpus, host=self.host, now=timezone.now())
        if settings.PI_KEEP_JOB_DIRS or self.sandbox_until is not None:
            jobfiles.let_go(dirs)  # kept whole: for debugging, or for the sandbox (its KEEP_UNTIL)
        elif kept.is_kept(dirs.root):
            kept.strip_to_kept(dirs.root)  # the unpublished work stays (KEEP_UNTIL); the prompt and clone go
            jobfiles.let_go(dirs)
        else:
            jobfiles.remove(dirs)

    @property
    def workspace_folder(self) -> Path | None:
        """A local job's folder, mounted as its workspace (a forge job's is its clone in the job's folders)."""
        return self.local.folder if self.local is not None else None
