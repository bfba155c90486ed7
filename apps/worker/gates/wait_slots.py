"""Wait checks, bounded (PI_WAIT_CHECK_SLOTS). A held job's check scripts run wherever its wake lands, so a
bound per host alone would multiply with the fleet; the check slots are two leases (apps/worker/gates/leases.py):

    wc:<host>  at most min(PI_WAIT_CHECK_SLOTS, max(1, concurrency - 1)) checks at once on this host, so a
               check never takes the host's last paid slot (concurrency: its worker processes, at most its
               live PI_CONCURRENCY)
    wc         at most PI_WAIT_CHECK_SLOTS at once fleet-wide, when the host declares its name

Both are held only while the job's checks run, and given back on every exit of the `with` (the gate's
refusals and deferrals included). Their TTL is derived from what they guard, every profile in turn
(each bounded by PI_WAIT_CHECK_TIMEOUT_SECONDS and the kill grace) and one more for the rest: a TTL
shorter than the checks would let another host take a slot still in use. A job denied either is
throttled by the wait gate (apps/worker/gates/waitfor.py), never refused for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings

from apps.fleet.hosts import this_host
from apps.worker.gates import host_slots, leases
from apps.worker.gates.hostscripts import KILL_GRACE_SECONDS

FLEET_LEASE = "wc"


@dataclass(frozen=True)
class Denied:
    """Which bound said no, and the numbers the operator's knobs set."""

    where: str  # host | fleet
    slots: int
    concurrency: int


def host_limit(concurrency: int) -> int:
    return min(settings.PI_WAIT_CHECK_SLOTS, max(1, concurrency - 1))


def lease_seconds(profiles: int) -> float:
    return (profiles + 1) * (settings.PI_WAIT_CHECK_TIMEOUT_SECONDS + KILL_GRACE_SECONDS)


@contextmanager
def check_slots(redis, job_id: str, profiles: int) -> Iterator[Denied | None]:
    """Yields None with this host's slot (and the fleet's) held for the job's `profiles` checks, or the
    bound that denied one. No checks to run, no slots taken."""
    held: list[leases.Lease] = []
    denied = None
    try:
        if profiles:
            host = this_host()
            concurrency = host_slots.concurrency(redis, host.name)
            bounds = [("host", f"wc:{host.name}", host_limit(concurrency))]
            if host.declared:
                bounds.append(("fleet", FLEET_LEASE, settings.PI_WAIT_CHECK_SLOTS))
            holder = leases.holder_id(host.name, job_id)
            for where, name, slots in bounds:
                lease = leases.acquire(redis, name, slots, holder, lease_seconds(profiles))
                if lease is None:
                    denied = Denied(where, slots, concurrency)
                    break
                held.append(lease)
        yield denied
    finally:
        leases.release_all(redis, held, job_id)
