"""The host budget (gate 5b): each job has a size (memory, CPUs), each host a budget, each project a share of it and a
floor of jobs; a job starts only when it fits.

Sizes: PI_JOB_MEMORY / PI_JOB_CPUS (or the settings row over them), a `project:<id>` row's `memory` / `cpus` over
those, resolved here at pickup, enforced on the container (its memory limit, no swap beyond it, and `--cpus`) and
recorded on the run. The budget: PI_HOST_MEMORY_BUDGET / PI_HOST_CPU_BUDGET, `auto` (what the engine reports less
PI_HOST_RESERVE_MEMORY / PI_HOST_RESERVE_CPUS), an amount, or `off`; below one default job the worker refuses to start.

Admission is one Redis script per decision over this host's ledger, shared by every worker process of the host:
`running` (holder -> size and project: every admitted attempt, until it ends) and `waiting` (job id -> size, project,
the project's minJobs, since when it waits, when it last asked, whether another gate holds it). A job starts only if
the running sizes, its own and every hold ranked above it fit the budget in both dimensions, and its project stays
within its `hostShare`. Holds go to the oldest waiter of each project below its `minJobs` here (oldest first), then
to the single oldest waiter overall: a big job keeps its room while small ones pass it by, so it is not starved.
A job that does not fit now is deferred `host-budget` (the waiter keeps its place); one that never can is refused:
`job-size-exceeds-host`, `job-size-exceeds-share`, or for a forge job on the shared queue that no live host's
budget holds, `job-size-exceeds-fleet` once two registry reads PI_FLEET_FIT_CONFIRM_SECONDS apart agree.

The ledger is rebuilt from the engine when Redis has none (`listed` missing: a fresh or emptied Redis): the job
containers still running on this host, sized by their labels, before anything is admitted. A holder whose attempt
no longer runs (its work horse was killed) is swept when a decision would defer; a waiter that stopped asking is
verified against its RQ job and dropped once it is not waiting any more.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from docker.errors import DockerException
from redis.exceptions import RedisError
from requests import RequestException

from apps.fleet import host_usage
from apps.worker.gates import leases
from apps.worker.sandbox import container

logger = logging.getLogger("pidispatch.host_budget")

PREFIX = host_usage.PREFIX
MIB = 1024 * 1024
# A waiter that has not asked for this long is checked against its RQ job: still queued or scheduled, it keeps its
# place; otherwise (ran elsewhere, cancelled, gone) it is dropped.
VERIFY_AFTER_MS = 15_000
WAITING_REASONS = ("host-budget", "host-too-small")  # the deferrals of gate 5b: the job keeps its place in line

MEMORY_LABEL = "pidispatch.memory-mib"
CPU_LABEL = "pidispatch.cpu-centi"
PROJECT_LABEL = "pidispatch.project"


@dataclass(frozen=True)
class JobSize:
    """A job's container size: memory in MiB, CPUs in hundredths, and where it came from (`default` or `project`)."""

    memory_mib: int
    cpu_centi: int
    source: str = "default"

    @property
    def memory(self) -> str:
        return f"{self.memory_mib}m"

    @property
    def cpus(self) -> float:
        return self.cpu_centi / 100

    def labels(self, project: str) -> dict[str, str]:
        return {MEMORY_LABEL: str(self.memory_mib), CPU_LABEL: str(self.cpu_centi), PROJECT_LABEL: project}

    def record_fields(self) -> dict:
        return {"job_memory_mib": self.memory_mib, "job_cpus": Decimal(self.cpu_centi) / 100,
                "size_source": self.source}


def memory_mib(size: str) -> int:
    return math.ceil(container.memory_bytes(size) / MIB)


def cpu_centi(cpus) -> int:
    return round(float(cpus) * 100)


def job_size(project_row, runtime) -> JobSize:
    """The job's size: its project row's `memory` / `cpus` (scoped limits v3) over the deployment's."""
    memory = project_row.memory if project_row is not None and project_row.memory else ""
    cpus = project_row.cpus if project_row is not None and project_row.cpus is not None else None
    source = "project" if memory or cpus is not None else "default"
    return JobSize(memory_mib(memory or runtime.job_memory), cpu_centi(runtime.job_cpus if cpus is None else cpus),
                   source)


def default_size() -> JobSize:
    return JobSize(memory_mib(settings.PI_JOB_MEMORY), cpu_centi(settings.PI_JOB_CPUS))


# --- the host's budget -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostBudget:
    """What this host's jobs may use together; None in a dimension that is `off`."""

    memory_mib: int | None
    cpu_centi: int | None
    # What the engine reported (`doctor` says it beside the budget); 0 when it was not asked.
    engine_memory_mib: int = 0
    engine_cpu_centi: int = 0

    def holds(self, size: JobSize) -> bool:
        return ((self.memory_mib is None or size.memory_mib <= self.memory_mib)
                and (self.cpu_centi is None or size.cpu_centi <= self.cpu_centi))

    def share(self, percent: int | None) -> tuple[int | None, int | None]:
        if not percent:
            return None, None
        return (None if self.memory_mib is None else self.memory_mib * percent // 100,
                None if self.cpu_centi is None else self.cpu_centi * percent // 100)

    def share_holds(self, size: JobSize, percent: int | None) -> bool:
        """Whether a project's share (`hostShare`, percent) of this budget holds one job of `size`."""
        memory, cpus = self.share(percent)
        return (memory is None or size.memory_mib <= memory) and (cpus is None or size.cpu_centi <= cpus)


class BudgetInvalid(ImproperlyConfigured):
    """The budget settings say what cannot work: the worker refuses to start, saying why."""


def _reserve_memory_mib(total_mib: int) -> int:
    value = settings.PI_HOST_RESERVE_MEMORY.strip().lower()
    if value == "auto":  # a tenth of the machine, at least 1 GiB, at most 4 GiB
        return min(max(total_mib // 10, 1024), 4096)
    return memory_mib(value)


def _reserve_cpu_centi(total_centi: int) -> int:
    value = settings.PI_HOST_RESERVE_CPUS.strip().lower()
    if value == "auto":  # one CPU for the host itself once it has four
        return 100 if total_centi >= 400 else 0
    return cpu_centi(value)


def _dimension(name: str, value: str, engine_total: int, reserve, parse, default: int, unit) -> int | None:
    value = value.strip().lower()
    if value == "off":
        return None
    if value == "auto":
        if engine_total < default:
            raise BudgetInvalid(
                f"{name}=auto: the engine reports {unit(engine_total)}, less than one default job "
                f"({unit(default)}): lower the job size (PI_JOB_MEMORY / PI_JOB_CPUS) or set {name} to off.")
        # Never below one default job: a host that holds one job runs it, eating into the reserve.
        return max(engine_total - reserve(engine_total), default)
    try:
        amount = parse(value)
    except (ValueError, TypeError):
        raise BudgetInvalid(f"{name}={value!r} is not auto, off or an amount.") from None
    if amount < default:
        raise BudgetInvalid(f"{name}={value} is below one default job ({unit(default)}): no job could start. "
                            f"Raise it, lower the job size (PI_JOB_MEMORY / PI_JOB_CPUS), or set it to off.")
    return amount


def _mib_words(mib: int) -> str:
    return f"{mib // 1024}g" if mib % 1024 == 0 else f"{mib}m"


def _cpu_words(centi: int) -> str:
    return f"{centi / 100:g} CPUs"


def compute_budget(engine_facts: tuple[int, int] | None = None) -> HostBudget:
    """The budget as the settings say, `auto` from the engine's totals (asked when not given). Raises BudgetInvalid,
    or container.EngineUnavailable when `auto` needs an engine that does not answer."""
    memory_setting, cpu_setting = settings.PI_HOST_MEMORY_BUDGET, settings.PI_HOST_CPU_BUDGET
    needs_engine = "auto" in (memory_setting.strip().lower(), cpu_setting.strip().lower())
    if engine_facts is None and needs_engine:
        engine_facts = engine_totals()
    engine_memory, engine_cpus = engine_facts or (0, 0)
    default = default_size()
    return HostBudget(
        memory_mib=_dimension("PI_HOST_MEMORY_BUDGET", memory_setting, engine_memory, _reserve_memory_mib,
                              memory_mib, default.memory_mib, _mib_words),
        cpu_centi=_dimension("PI_HOST_CPU_BUDGET", cpu_setting, engine_cpus, _reserve_cpu_centi, cpu_centi,
                             default.cpu_centi, _cpu_words),
        engine_memory_mib=engine_memory, engine_cpu_centi=engine_cpus)


def engine_totals() -> tuple[int, int]:
    """The engine's memory (MiB) and CPUs (hundredths), as `docker info` reports them."""
    try:
        info = container.engine().info()
    except (DockerException, RequestException) as error:
        raise container.EngineUnavailable(type(error).__name__) from None
    return int(info.get("MemTotal", 0)) // MIB, int(info.get("NCPU", 0)) * 100


_budget: tuple[tuple, HostBudget] | None = None


def current() -> HostBudget:
    """This host's budget, worked out once per process for the settings in force (a fork inherits its parent's)."""
    global _budget
    key = (settings.PI_HOST_MEMORY_BUDGET, settings.PI_HOST_CPU_BUDGET, settings.PI_HOST_RESERVE_MEMORY,
           settings.PI_HOST_RESERVE_CPUS, settings.PI_JOB_MEMORY, settings.PI_JOB_CPUS)
    if _budget is None or _budget[0] != key:
        _budget = (key, compute_budget())
    return _budget[1]


# --- the ledger --------------------------------------------------------------------------------------------------

_keys = host_usage.ledger_keys
usage = host_usage.usage  # what a host's jobs use now (the fleet panel and /metrics read it there)


# KEYS: running, waiting, listed. ARGV: now ms, job id, holder, memory, cpus, project, minJobs, budget memory, budget
# cpus, share memory, share cpus (-1: no bound), the verify age in ms. Returns {'admitted'}, {'unlisted'} or
# {'wait', 'host' | 'share', ahead}: ahead = the holds ranked above the job.
_ADMIT = """
local now, job, holder = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local mem, cpu, project, floor = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local budget_mem, budget_cpu = tonumber(ARGV[8]), tonumber(ARGV[9])
local share_mem, share_cpu, verify = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
if redis.call('EXISTS', KEYS[3]) == 0 then return {'unlisted'} end
if redis.call('HEXISTS', KEYS[1], holder) == 1 then return {'admitted'} end
local function split(value)
  local out = {}
  for part in string.gmatch(value, '[^ ]+') do out[#out + 1] = part end
  return out
end
local used_mem, used_cpu, count = 0, 0, {}
local project_mem, project_cpu = 0, 0
local running = redis.call('HGETALL', KEYS[1])
for i = 2, #running, 2 do
  local f = split(running[i])
  used_mem, used_cpu = used_mem + tonumber(f[1]), used_cpu + tonumber(f[2])
  local p = f[3] or ''
  count[p] = (count[p] or 0) + 1
  if p == project and p ~= '' then
    project_mem, project_cpu = project_mem + tonumber(f[1]), project_cpu + tonumber(f[2])
  end
end
local since = now
local mine = redis.call('HGET', KEYS[2], job)
if mine then since = tonumber(split(mine)[5]) end
local p_mine = project ~= '' and project or '-'
redis.call('HSET', KEYS[2], job, table.concat({mem, cpu, p_mine, floor, since, now, 0}, ' '))
local oldest, oldest_of = nil, {}
local waiting = redis.call('HGETALL', KEYS[2])
for i = 1, #waiting, 2 do
  local id, f = waiting[i], split(waiting[i + 1])
  local w = {id = id, mem = tonumber(f[1]), cpu = tonumber(f[2]), project = f[3], floor = tonumber(f[4]),
             since = tonumber(f[5]), seen = tonumber(f[6]), suspended = f[7] == '1'}
  local live = not w.suspended
  if live and id ~= job and now - w.seen > verify then
    local status = redis.call('HGET', 'rq:job:' .. id, 'status')
    if status ~= 'queued' and status ~= 'scheduled' and status ~= 'deferred' then
      redis.call('HDEL', KEYS[2], id)
      live = false
    end
  end
  if live then
    if oldest == nil or w.since < oldest.since or (w.since == oldest.since and id < oldest.id) then oldest = w end
    if w.project ~= '-' and w.floor > 0 and (count[w.project] or 0) < w.floor then
      local o = oldest_of[w.project]
      if o == nil or w.since < o.since or (w.since == o.since and id < o.id) then oldest_of[w.project] = w end
    end
  end
end
local holds = {}
for _, w in pairs(oldest_of) do holds[#holds + 1] = w end
table.sort(holds, function(a, b) if a.since == b.since then return a.id < b.id end return a.since < b.since end)
local listed = {}
for _, w in ipairs(holds) do listed[w.id] = true end
if oldest ~= nil and not listed[oldest.id] then holds[#holds + 1] = oldest end
local ahead_mem, ahead_cpu, ahead = 0, 0, 0
for _, w in ipairs(holds) do
  if w.id == job then break end
  ahead_mem, ahead_cpu, ahead = ahead_mem + w.mem, ahead_cpu + w.cpu, ahead + 1
end
if (share_mem >= 0 and project_mem + mem > share_mem) or (share_cpu >= 0 and project_cpu + cpu > share_cpu) then
  return {'wait', 'share', ahead}
end
if (budget_mem >= 0 and used_mem + mem + ahead_mem > budget_mem)
    or (budget_cpu >= 0 and used_cpu + cpu + ahead_cpu > budget_cpu) then
  return {'wait', 'host', ahead}
end
redis.call('HDEL', KEYS[2], job)
redis.call('HSET', KEYS[1], holder, table.concat({mem, cpu, p_mine}, ' '))
return {'admitted'}
"""

# KEYS: waiting. ARGV: job id. A waiter another gate holds back keeps its place and gives up its room.
_SUSPEND = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if not value then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], (string.gsub(value, ' [01]$', ' 1')))
return 1
"""


@dataclass(frozen=True)
class Decision:
    admitted: bool
    bound: str = ""  # `host` or `share`: what it waits for
    ahead: int = 0  # holds ranked above it


def _bound(value: int | None) -> int:
    return -1 if value is None else value


def decide(redis, host: str, *, job_id: str, holder: str, size: JobSize, project: str, min_jobs: int | None,
           budget: HostBudget, share_percent: int | None, now_ms: int | None = None) -> Decision:
    """One admission decision for `job_id` on `host` (Redis first, the engine only when the ledger must be listed)."""
    keys = _keys(host)
    share_memory, share_cpus = budget.share(share_percent)
    args = [now_ms if now_ms is not None else int(time.time() * 1000), job_id, holder, size.memory_mib,
            size.cpu_centi, project, min_jobs or 0, _bound(budget.memory_mib), _bound(budget.cpu_centi),
            _bound(share_memory), _bound(share_cpus), VERIFY_AFTER_MS]
    swept = False
    for _ in range(3):
        answer = [_text(part) for part in redis.eval(_ADMIT, 3, *keys, *args)]
        if answer[0] == "admitted":
            return Decision(True)
        if answer[0] == "unlisted":
            list_survivors(redis, host)
            continue
        if swept or not sweep_gone(redis, host):
            return Decision(False, answer[1], int(answer[2]))
        swept = True
    return Decision(False, "host")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def release(redis, host: str, holder: str) -> None:
    redis.hdel(_keys(host)[0], holder)


def suspend(redis, host: str, job_id: str) -> None:
    redis.eval(_SUSPEND, 1, _keys(host)[1], job_id)


def sweep_gone(redis, host: str) -> bool:
    """Drop the running entries whose attempt no longer runs (its work horse was killed); True when any went."""
    running_key = _keys(host)[0]
    gone = [holder for holder in redis.hkeys(running_key)
            if not leases._holder_is_running(redis, _text(holder))]
    if gone:
        redis.hdel(running_key, *gone)
        logger.info("host_budget_swept host=%s holders=%d", host, len(gone))
    return bool(gone)


def list_survivors(redis, host: str) -> int:
    """Put this host's running job containers (sized by their labels) in the ledger, then mark it listed: until
    then nothing is admitted. Raises container.EngineUnavailable when the engine does not answer."""
    try:
        found = container.engine().containers.list(filters={"label": [f"{container.HOST_LABEL}={host}"]},
                                                   ignore_removed=True)
    except (DockerException, RequestException) as error:
        raise container.EngineUnavailable(type(error).__name__) from None
    running_key, _, listed_key = _keys(host)
    entries = {}
    for survivor in found:
        labels = survivor.labels or {}
        job_id = labels.get(container.JOB_LABEL)
        if not survivor.name.startswith(container.CONTAINER_PREFIX) or not job_id:
            continue
        size = _labelled_size(labels)
        project = labels.get(PROJECT_LABEL) or "-"
        entries[leases.holder_id(host, job_id)] = f"{size.memory_mib} {size.cpu_centi} {project}"
    pipe = redis.pipeline()
    if entries:
        pipe.hset(running_key, mapping=entries)
    pipe.set(listed_key, str(int(time.time())))
    pipe.execute()
    logger.info("host_budget_listed host=%s survivors=%d", host, len(entries))
    return len(entries)


def _labelled_size(labels: dict) -> JobSize:
    """A survivor's size from its labels; one started before sizes were labelled counts as a default job."""
    try:
        return JobSize(int(labels[MEMORY_LABEL]), int(labels[CPU_LABEL]))
    except (KeyError, ValueError):
        return default_size()


def fleet_key(job_id: str) -> str:
    return f"{PREFIX}:fleet:{job_id}"


def fleet_none_since(redis, job_id: str, now: float) -> float:
    """Since when registry reads have found no live host whose budget holds the job (this read's time the first)."""
    key = fleet_key(job_id)
    redis.set(key, f"{now:.3f}", nx=True, ex=86400)
    return float(_text(redis.get(key) or now))


def budget_at_start() -> HostBudget | None:
    """The budget a worker starts with: BudgetInvalid refuses the start (saying why); None when `auto` needs an
    engine that does not answer yet (the first job's gate asks it again)."""
    try:
        return current()
    except container.EngineUnavailable as error:
        logger.warning("host_budget_unknown error=%s: worked out at the first job", error)
        return None


def list_at_start(redis, host: str) -> None:
    """After the boot reaper: the survivors into the ledger. A fault leaves it unlisted: the first decision lists."""
    try:
        list_survivors(redis, host)
    except (container.EngineUnavailable, RedisError) as error:
        logger.warning("host_budget_unlisted host=%s error=%s", host, type(error).__name__)


def registry_fields(budget: HostBudget | None) -> dict[str, str]:
    """What the host row says of its budget (registry.HostFacts)."""
    if budget is None:
        return {"budget_memory": "", "budget_cpus": ""}
    return {"budget_memory": "off" if budget.memory_mib is None else str(budget.memory_mib),
            "budget_cpus": "off" if budget.cpu_centi is None else str(budget.cpu_centi)}


def recheck_at(now):
    return now + timedelta(seconds=settings.PI_HOST_BUDGET_RECHECK_SECONDS)
