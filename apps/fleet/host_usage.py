"""What each host's jobs use of its budget, as its host budget ledger says (apps/worker/gates/host_budget.py writes
it): the fleet panel, `fleet status --json` and /metrics read it here. The ledger's key names live here, once."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.fleet.connection import text

PREFIX = "pidispatch:fit"


def ledger_keys(host: str) -> tuple[str, str, str]:
    """The host's running jobs (holder -> `memory cpus project`), its waiters, and whether it was listed."""
    return f"{PREFIX}:{host}:running", f"{PREFIX}:{host}:waiting", f"{PREFIX}:{host}:listed"


@dataclass(frozen=True)
class Usage:
    memory_mib: int = 0
    cpu_centi: int = 0
    jobs: int = 0
    # project (`-`: none) -> (memory MiB, CPUs in hundredths, jobs)
    by_project: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    waiting: int = 0

    @property
    def cpus(self) -> float:
        return self.cpu_centi / 100

    def as_json(self) -> dict:
        return {"memory_mib": self.memory_mib, "cpus": self.cpus, "jobs": self.jobs, "waiting": self.waiting,
                "by_project": {project: {"memory_mib": mem, "cpus": cpu / 100, "jobs": jobs}
                               for project, (mem, cpu, jobs) in sorted(self.by_project.items())}}


def _usage(values, waiting) -> Usage:
    memory = cpus = 0
    by_project: dict[str, tuple[int, int, int]] = {}
    for value in values:
        mem, cpu, project = ([*text(value).split(" "), "-"])[:3]
        memory, cpus = memory + int(mem), cpus + int(cpu)
        was = by_project.get(project, (0, 0, 0))
        by_project[project] = (was[0] + int(mem), was[1] + int(cpu), was[2] + 1)
    return Usage(memory, cpus, len(values), by_project, int(waiting or 0))


def usages(redis, hosts: list[str]) -> dict[str, Usage]:
    """Each host's usage, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for host in hosts:
        running, waiting, _ = ledger_keys(host)
        pipe.hvals(running)
        pipe.hlen(waiting)
    replies = pipe.execute()
    return {host: _usage(replies[2 * i], replies[2 * i + 1]) for i, host in enumerate(hosts)}


def usage(redis, host: str) -> Usage:
    return usages(redis, [host])[host]
