"""The host-wide slot: PI_CONCURRENCY, live, caps the containers one host runs at once, across the shared
and the host queue, below its number of worker processes (without it, each process runs one job).

The slot is a lease of `h:<host>` (apps/worker/gates/leases.py), like the scope and folder slots of gate 4 and
taken before them: a job that cannot run on this host now defers `host-busy` at the scope gate's cadence
(same id, no attempt used), and whatever the climb ends in gives it back (Attempt.hold). A work horse
that crashed holding it is taken over at once, as any lease is. The cap is read at every job's gate 4, so
lowering it in the admin applies to the next start on every host (the slots still held count against the
lower cap until their jobs end).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings

from apps.fleet import registry
from apps.worker.gates import leases, runtime_settings
from apps.worker.gates.verdicts import GateDeferral
from apps.worker.jobs import job_time_budget_seconds

if TYPE_CHECKING:
    from apps.worker.gates.attempt import Attempt


def take(redis, attempt: Attempt) -> None:
    """The job's slot on this host, held by the attempt from here on; deferred `host-busy` when the host is full."""
    cap = runtime_settings.live_concurrency()
    if cap is None:
        return
    lease = leases.acquire(redis, f"h:{attempt.host}", cap, attempt.holder, job_time_budget_seconds())
    if lease is None:
        recheck = attempt.now + timedelta(seconds=settings.PI_SCOPE_BUSY_RECHECK_SECONDS)
        raise GateDeferral(recheck, "host-busy", {"slots": cap})
    attempt.hold_lease(lease)


def concurrency(redis, host: str) -> int:
    """How many jobs this host can run at once now: its worker processes (this one at least), at most its cap."""
    processes = max(1, registry.process_count(redis, host))
    cap = runtime_settings.live_concurrency()
    return min(processes, cap) if cap else processes
