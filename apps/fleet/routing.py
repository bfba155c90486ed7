"""Routing: which queue a job goes to, `pi-jobs` or `pi-jobs@<host>` (DESIGN section 4).

Host-affine work (cron, manual local runs, chained children, forge jobs that need a host-local
capability) goes to a live, routing host that declares what it needs; any doubt routes to `pi-jobs`.
"""

from .queues import SHARED_QUEUE


def queue_for(needs: frozenset[str] = frozenset()) -> str:
    """The queue for a forge job needing these capability names (`secrets:<profile>`, `wait:<profile>`).

    Until the host registry can answer which live host declares a capability, every doubt routes to
    the shared queue.
    """
    return SHARED_QUEUE
