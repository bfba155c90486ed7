"""The host registry (DESIGN section 4): which worker hosts exist, how fresh each is, and what each runs.

Every worker process refreshes its host's keys every PI_FLEET_BEAT_SECONDS (and at once when it starts
or ends a job); they expire after PI_FLEET_ROW_TTL_SECONDS. Readers call a host `live` (beat at most
PI_FLEET_LIVE_SECONDS old: routable), `stale` (older, row still there) or `gone` (row expired; listed
from the index for a day so a dead host's queue stays explainable).

Redis keys (values are names, numbers and flags only: never paths, titles or logins):
    pidispatch:hosts                    ZSET host name -> last beat (unix seconds); the index readers walk
    pidispatch:host:<name>              HASH the host row: name, declared (1 = routes), version, image,
                                             capabilities (comma-joined names), concurrency (the live
                                             PI_CONCURRENCY, "" for none), beat_at; expires
    pidispatch:host:<name>:workers      SET  RQ worker names of the host's worker processes; expires
    pidispatch:worker:<rq worker name>  HASH one worker process: host, pid, proc (liveness identity), queues,
                                             started_at, beat_at, drain_seen (1: it has seen its host's
                                             drain and takes no job until it is lifted), and while busy job,
                                             job_started_at, job_target, job_queue; expires
    pidispatch:host:<name>:card         HASH what the host declared (declared, capabilities), kept a day past its
                                             last beat: a dead host's capabilities still route work to its queue
                                             (routing.queue_for), where it waits for the host to return
Deleting all of them is safe: every reader then sees no host, and routing falls back to `pi-jobs`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from redis.exceptions import RedisError

from .connection import text
from .queues import is_dispatch_queue, is_valid_host_name

INDEX = "pidispatch:hosts"
GONE_KEPT_SECONDS = 24 * 3600
LIVE, STALE, GONE = "live", "stale", "gone"
_JOB_FIELDS = ("job", "job_started_at", "job_target", "job_queue")


class RegistryUnreadable(Exception):
    """The registry could not be read whole; callers keep the last known view and say so."""


def host_key(name: str) -> str:
    return f"pidispatch:host:{name}"


def host_workers_key(name: str) -> str:
    return f"pidispatch:host:{name}:workers"


def card_key(name: str) -> str:
    return f"pidispatch:host:{name}:card"


def worker_key(worker_name: str) -> str:
    return f"pidispatch:worker:{worker_name}"


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    started_at: float
    target: str = ""
    queue: str = ""


@dataclass(frozen=True)
class HostFacts:
    """What a worker host says about itself (the same from each of its processes)."""

    name: str
    declared: bool
    version: str
    image: str
    capabilities: tuple[str, ...] = ()
    concurrency: int | None = None  # the cap on containers at once; None: one per worker process
    # Its host budget (apps/worker/gates/host_budget.py): MiB and hundredths of a CPU, `off`, or "" (not known).
    budget_memory: str = ""
    budget_cpus: str = ""


@dataclass(frozen=True)
class ProcessFacts:
    worker_name: str
    pid: int
    proc: str
    started_at: float
    queues: tuple[str, ...] = ()
    job: RunningJob | None = None
    drain_seen: bool = False


@dataclass(frozen=True)
class WorkerProcess:
    worker_name: str
    host: str
    pid: int | None
    proc: str
    started_at: float | None
    beat_at: float | None
    queues: tuple[str, ...]
    job: RunningJob | None
    # Whether it has seen its host's drain (it takes no job until the drain is lifted); None: a worker of a release
    # before this field, which says only what it runs.
    drain_seen: bool | None = None


@dataclass(frozen=True)
class HostRow:
    name: str
    liveness: str
    beat_at: float | None
    declared: bool = False
    version: str = ""
    image: str = ""
    capabilities: tuple[str, ...] = ()
    concurrency: int | None = None
    processes: tuple[WorkerProcess, ...] = field(default_factory=tuple)
    budget_memory: str = ""  # as HostFacts says
    budget_cpus: str = ""

    def holds(self, memory_mib: int, cpu_centi: int) -> bool:
        """Whether its budget holds one job of this size (a host that does not say counts as holding it)."""
        return all(not bound.isdigit() or wanted <= int(bound)
                   for bound, wanted in ((self.budget_memory, memory_mib), (self.budget_cpus, cpu_centi)))

    @property
    def routes(self) -> bool:
        return self.declared and self.liveness == LIVE

    @property
    def started_at(self) -> float | None:
        starts = [p.started_at for p in self.processes if p.started_at]
        return min(starts) if starts else None

    @property
    def busy(self) -> int:
        return sum(1 for p in self.processes if p.job)

    @property
    def queues(self) -> tuple[str, ...]:
        return tuple(sorted({q for p in self.processes for q in p.queues}))

    @property
    def running(self) -> tuple[RunningJob, ...]:
        return tuple(sorted((p.job for p in self.processes if p.job), key=lambda job: job.started_at))

    def beat_age(self, now: float) -> float | None:
        return None if self.beat_at is None else max(0.0, now - self.beat_at)


def row_ttl() -> int:
    return max(1, int(settings.PI_FLEET_ROW_TTL_SECONDS))


def liveness_of(beat_at: float | None, row_exists: bool, now: float) -> str:
    if not row_exists or beat_at is None:
        return GONE
    return LIVE if now - beat_at <= settings.PI_FLEET_LIVE_SECONDS else STALE


# --- writing (worker processes) -----------------------------------------------------------------------

def publish(redis, host: HostFacts, process: ProcessFacts, now: float | None = None) -> None:
    """One beat: the host row, this process's entry, and the index, in one round trip."""
    now = time.time() if now is None else now
    ttl = row_ttl()
    entry = {
        "host": host.name,
        "pid": process.pid,
        "proc": process.proc,
        "queues": ",".join(process.queues),
        "started_at": f"{process.started_at:.3f}",
        "beat_at": f"{now:.3f}",
        "drain_seen": int(process.drain_seen),
    }
    if process.job:
        entry.update(job=process.job.job_id, job_started_at=f"{process.job.started_at:.3f}",
                     job_target=process.job.target, job_queue=process.job.queue)
    pipe = redis.pipeline(transaction=False)
    pipe.hset(host_key(host.name), mapping={
        "name": host.name, "declared": int(host.declared), "version": host.version, "image": host.image,
        "capabilities": ",".join(host.capabilities), "concurrency": host.concurrency or "",
        "budget_memory": host.budget_memory, "budget_cpus": host.budget_cpus, "beat_at": f"{now:.3f}",
    })
    pipe.expire(host_key(host.name), ttl)
    pipe.hset(card_key(host.name),
              mapping={"declared": int(host.declared), "capabilities": ",".join(host.capabilities)})
    pipe.expire(card_key(host.name), GONE_KEPT_SECONDS)
    pipe.sadd(host_workers_key(host.name), process.worker_name)
    pipe.expire(host_workers_key(host.name), ttl)
    pipe.hset(worker_key(process.worker_name), mapping=entry)
    if not process.job:
        pipe.hdel(worker_key(process.worker_name), *_JOB_FIELDS)
    pipe.expire(worker_key(process.worker_name), ttl)
    pipe.zadd(INDEX, {host.name: now})
    pipe.execute()


def withdraw(redis, host_name: str, worker_name: str) -> None:
    """A clean shutdown: this process leaves at once (the host row expires with its last process)."""
    pipe = redis.pipeline(transaction=False)
    pipe.delete(worker_key(worker_name))
    pipe.srem(host_workers_key(host_name), worker_name)
    pipe.execute()


# --- reading ------------------------------------------------------------------------------------------


def _number(value) -> float | None:
    try:
        return float(text(value))
    except ValueError:
        return None


def _names(value, valid) -> tuple[str, ...]:
    return tuple(name for name in text(value).split(",") if name and valid(name))


def _process(worker_name: str, raw: dict) -> WorkerProcess | None:
    data = {text(k): text(v) for k, v in raw.items()}
    host = data.get("host", "")
    if not is_valid_host_name(host):
        return None
    job = None
    if data.get("job"):
        job = RunningJob(job_id=data["job"], started_at=_number(data.get("job_started_at")) or 0.0,
                         target=data.get("job_target", ""), queue=data.get("job_queue", ""))
    pid = _number(data.get("pid"))
    return WorkerProcess(
        worker_name=worker_name, host=host, pid=int(pid) if pid else None, proc=data.get("proc", ""),
        started_at=_number(data.get("started_at")), beat_at=_number(data.get("beat_at")),
        queues=_names(data.get("queues"), is_dispatch_queue), job=job,
        drain_seen=data["drain_seen"] == "1" if "drain_seen" in data else None,
    )


def process_count(redis, host_name: str) -> int:
    """How many worker processes the host has now (an entry goes with its process, at the latest by its TTL)."""
    members = [text(name) for name in redis.smembers(host_workers_key(host_name))]
    pipe = redis.pipeline(transaction=False)
    for worker_name in members:
        pipe.exists(worker_key(worker_name))
    return sum(pipe.execute()) if members else 0


def read_process(redis, worker_name: str) -> WorkerProcess | None:
    raw = redis.hgetall(worker_key(worker_name))
    return _process(worker_name, raw) if raw else None


def read_hosts(redis, now: float | None = None, *, processes: bool = True) -> list[HostRow]:
    """Every host in the index, with its liveness and, unless `processes` is false, its worker processes (the
    queue union and routing need only the rows and cards: fewer reads). RegistryUnreadable if it cannot be read."""
    now = time.time() if now is None else now
    try:
        indexed = [(text(name), score) for name, score in redis.zrange(INDEX, 0, -1, withscores=True)]
        names = [(name, score) for name, score in indexed if is_valid_host_name(name)]
        pipe = redis.pipeline(transaction=False)
        for name, _ in names:
            pipe.hgetall(host_key(name))
            if processes:
                pipe.smembers(host_workers_key(name))
            pipe.hgetall(card_key(name))
        replies = pipe.execute()
        width = 3 if processes else 2
        rows_raw, cards = replies[0::width], replies[width - 1::width]
        members = ([sorted(text(m) for m in workers) for workers in replies[1::width]] if processes
                   else [[]] * len(names))
        pipe = redis.pipeline(transaction=False)
        for workers in members:
            for worker_name in workers:
                pipe.hgetall(worker_key(worker_name))
        entries = iter(pipe.execute() if processes else ())
        forgotten = [name for name, score in indexed if now - score > GONE_KEPT_SECONDS]
        if forgotten:
            redis.zrem(INDEX, *forgotten)
    except RedisError as exc:
        raise RegistryUnreadable(f"host registry unreadable ({type(exc).__name__})") from exc

    hosts = []
    for (name, indexed_beat), raw, workers, card in zip(names, rows_raw, members, cards, strict=True):
        processes = []
        for worker_name in workers:
            raw_entry = next(entries)
            process = _process(worker_name, raw_entry) if raw_entry else None
            if process and process.host == name:
                processes.append(process)
        row = {text(k): text(v) for k, v in raw.items()}
        declared = row or {text(k): text(v) for k, v in card.items()}  # a gone host: its card
        beat_at = _number(row.get("beat_at")) if row else indexed_beat
        concurrency = _number(row.get("concurrency"))
        if now - indexed_beat > GONE_KEPT_SECONDS:
            continue
        hosts.append(HostRow(
            name=name,
            liveness=liveness_of(beat_at, bool(row), now),
            beat_at=beat_at,
            declared=declared.get("declared") == "1",
            version=row.get("version", ""),
            image=row.get("image", ""),
            capabilities=_names(declared.get("capabilities"), lambda c: ":" in c),
            concurrency=int(concurrency) if concurrency else None,
            processes=tuple(processes) if row else (),
            budget_memory=row.get("budget_memory", ""),
            budget_cpus=row.get("budget_cpus", ""),
        ))
    return sorted(hosts, key=lambda h: h.name)


# --- process liveness ---------------------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _machine() -> str:
    """This machine and PID namespace: PIDs are comparable only between processes that share both."""
    boot = _read("/proc/sys/kernel/random/boot_id") or "noboot"
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "nons"
    return f"{boot}/{namespace}"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a PID apart from a later one that reuses it)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":  # a zombie has died
        return None
    return fields[19]


def process_identity(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{_machine()}/{pid}/{_start_ticks(pid) or '?'}"


def process_alive(process: WorkerProcess | None) -> bool:
    """A process with an entry is alive, unless it ran on this machine and its PID says it has died."""
    if process is None:
        return False
    machine, _, ticks = process.proc.rpartition("/")
    machine = machine.rpartition("/")[0]
    if machine != _machine() or process.pid is None or ticks == "?":
        return True
    return _start_ticks(process.pid) == ticks
