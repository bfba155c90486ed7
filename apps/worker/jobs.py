"""The job contract (DESIGN section 5): JobSpec, job ids, and the one enqueue function.

A JobSpec is the only payload a job carries. It holds what the container needs (flow or command, the
issue or comment text, instructions) and ids for the record. The texts live only here and in the
container's /job files: the run record, the logs and the inbox never copy them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError
from rq import Queue
from rq.exceptions import DeserializationError
from rq.scripts import _build_hset_args

from apps import forge_registry
from apps.fleet.connection import get_redis, text

from . import accepted

logger = logging.getLogger("pidispatch.jobs")

JOB_SPEC_VERSION = 1
JOB_FUNCTION = "apps.worker.tasks.execute_job"
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")

FORGE_KINDS = forge_registry.NAMES
KINDS = FORGE_KINDS + ("local",)
DELIVERY_PREFIXES = {forge.name: forge.job_prefix for forge in forge_registry.FORGES}
# Merge/pull requests have their own number sequence on these forges, written `!n` instead of `#n`.
SEPARATE_PR_NUMBERING = {forge.name for forge in forge_registry.FORGES if forge.separate_pr_numbering}

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_DELIVERY_PART = 80
# A delivery id kept as it is must not end like a replica suffix (`abc-r1` would be replica 1 of `abc`) nor
# hold the `--` that marks a mapped id (it could then be another id's mapped form).
_NOT_KEPT = re.compile(r"--|-r[0-9]+$")


class JobSpecError(ValueError):
    """A payload that is not a JobSpec this code understands (wrong version, missing field)."""


def delivery_part(delivery_id: str) -> str:
    """A (non-empty) delivery id in the job-id charset: what job ids and log lines carry of it.

    An ordinary id is kept as it is. Any other one (a character outside the charset, more than 80 of them, a
    `-r<n>` at its end, a `--` in it) is mapped deterministically: its unsafe characters become `_`, then
    `--` and 16 hex of its SHA-256. Only mapped ids hold `--` and none ends in `-r<n>`, so no delivery id
    can produce another's job id, nor a replica's.
    """
    if JOB_ID_PATTERN.fullmatch(delivery_id) and len(delivery_id) <= _MAX_DELIVERY_PART \
            and not _NOT_KEPT.search(delivery_id):
        return delivery_id
    digest = hashlib.sha256(delivery_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_UNSAFE.sub('_', delivery_id)[:_MAX_DELIVERY_PART]}--{digest}"


def delivery_job_id(kind: str, delivery_id: str, replica: int | None = None) -> str:
    """`gh-<delivery>` and friends (the delivery id as `delivery_part` maps it); `-r<i>` for a replica."""
    if kind not in DELIVERY_PREFIXES:
        raise ValueError(f"no delivery job ids for kind {kind!r}")
    if not isinstance(delivery_id, str) or not delivery_id:
        raise ValueError("a delivery job id needs a non-empty delivery id")
    job_id = f"{DELIVERY_PREFIXES[kind]}-{delivery_part(delivery_id)}"
    if replica is not None:
        if not isinstance(replica, int) or replica < 1:
            raise ValueError("a replica index is a positive integer")
        job_id += f"-r{replica}"
    return job_id


def chain_job_id(parent_job_id: str, flow: str, task: str) -> str:
    """`chain-<16 hex>`: a chained child's id, from its parent's id, flow and task, so that the same request
    made again (a parent's attempt run again) names the same job, which enqueue swallows."""
    digest = hashlib.sha256("\0".join((parent_job_id, flow, task)).encode("utf-8", "surrogatepass")).hexdigest()
    return f"chain-{digest[:16]}"


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    kind: str
    # Forge jobs: the repository and the issue or pull request the job is about.
    repo: str = ""
    target_type: str = ""  # "issue" | "pull_request" | "local"
    number: int | None = None
    # Forge ids the API and clone steps need: GitLab numeric project id; Azure project and repository GUIDs.
    project_id: str = ""
    repository_id: str = ""
    # Pull requests: head {ref, sha, repo} and base {ref}, as the forge sent them. Data only, never a clone ref.
    head: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    # Exactly one of flow / command.
    flow: str = ""
    command: str = ""
    # Container-only texts (never copied into a record or a log line).
    title: str = ""
    body: str = ""
    comment: str = ""
    instructions: str = ""
    task: str = ""
    # Local jobs: the folder on the worker host; `force` runs it even when the git tree is dirty.
    folder: str = ""
    force: bool = False
    # Execution fields copied from the matched trigger's `run` (absent = the deployment's default).
    image: str = ""
    provider: str = ""
    model: str = ""
    max_turns: int | None = None
    models: tuple[str, ...] = ()  # the trigger's run.models (provider/model); empty: PI_ALLOWED_MODELS, else any
    max_cost_usd: str = ""  # the trigger's run.maxCostUsd (dollars): lowers the per-job cap, never raises it
    exclude_tools: tuple[str, ...] = ()
    wait_for: tuple[dict, ...] = ()  # ({"after": iso} | {"profile": name}, ...)
    secrets: dict[str, str] = field(default_factory=dict)  # NAME -> reference (never a value)
    secrets_profile: str = ""
    resume: bool = False
    allow_ci_changes: bool = False  # the trigger lets the published work change CI definitions
    publish_to: str = ""  # `run.publishTo`: "fork" pushes to the deployment's fork; "" or "origin" to the repository
    packages: bool = True  # load the overlay's staged pi packages (a trigger's `run.packages: false` opts out)
    skills_dir: str = ""  # a host folder of skills copied into the job (`run.skillsDir`)
    github: bool = False  # a cron job whose commits the worker publishes to its folder's GitHub repository
    backend: str = ""  # the venue (`run.backend`); "" = local
    once: bool = False  # the matched rule is a one-shot close rule
    once_armed_at: str = ""  # ISO instant the one-shot rule was (re-)armed; older runs do not spend it
    # Ids for the record.
    trigger_id: int | None = None
    trigger_type: str = ""
    delivery_id: str = ""
    replica: int | None = None
    replicas: int | None = None
    parent_job_id: str = ""
    chain_depth: int = 0  # a chained child's distance from the job that started the chain (apps/worker/chaining/)
    # The `.pi/` tree the chain's first job started on (its git tree id, or "none"): a child runs only while its own
    # `.pi/` is that one, so no agent of the chain rewrites the skills or the chainable flows of those after it.
    chain_pi_tree: str = ""
    # The project (Project.slug) the job's target belonged to when it was enqueued: stamped once by enqueue(), so
    # the project row it reserves in, the container size it gets and the project its run records are one answer
    # whatever projects.json says by the time it runs (or is retried). Blank: none.
    project: str = ""
    # Descriptive context for /job/event.json: event, action, sender id, what matched.
    context: dict[str, Any] = field(default_factory=dict)
    version: int = JOB_SPEC_VERSION

    def __post_init__(self):
        if not JOB_ID_PATTERN.fullmatch(self.job_id or ""):
            raise JobSpecError(f"job id {self.job_id!r} does not match {JOB_ID_PATTERN.pattern}")
        if self.kind not in KINDS:
            raise JobSpecError(f"unknown job kind {self.kind!r}")
        if bool(self.flow) == bool(self.command):
            raise JobSpecError("a job carries exactly one of flow or command")

    # --- identity for records and logs (PII-free) ---

    @property
    def target(self) -> str:
        if self.kind == "local":
            return f"local:{PurePosixPath(self.folder).name}"
        if self.number is None:
            return self.repo
        sep = "!" if self.target_type == "pull_request" and self.kind in SEPARATE_PR_NUMBERING else "#"
        return f"{self.repo}{sep}{self.number}"

    @property
    def scope(self) -> str:
        if self.kind == "local":
            return f"local:{PurePosixPath(self.folder).name}"
        return f"{self.kind}:{self.repo}"

    @property
    def flow_or_command(self) -> str:
        return self.flow or f"cmd:{self.command}"

    # --- serialisation ---

    def to_payload(self) -> dict[str, Any]:
        # Shallow on purpose (`dataclasses.asdict` deep-copies, a fifth of a webhook's enqueue): the payload
        # is pickled straight away and never changed.
        payload = {name: getattr(self, name) for name in _FIELD_NAMES}
        for name in ("chain_depth", "models"):
            if not payload[name]:
                del payload[name]  # only some jobs carry it: the other payloads stay as older workers read them
        # Likewise the overlay and venue fields, unless a trigger set them.
        for name, default in _OPTIONAL_DEFAULTS.items():
            if payload[name] == default:
                del payload[name]
        if not self.project:
            del payload["project"]  # likewise: only a project's job carries it
        return payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> JobSpec:
        if not isinstance(payload, dict):
            raise JobSpecError("a job payload is a JSON object")
        version = payload.get("version")
        if version != JOB_SPEC_VERSION:
            raise JobSpecError(f"job payload version {version!r} is not {JOB_SPEC_VERSION}; upgrade every worker")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(payload) - known
        if unknown:
            raise JobSpecError(f"job payload has unknown fields: {', '.join(sorted(unknown))}")
        payload = {**payload}
        # JSON has lists; the spec keeps tuples (hashable, frozen)
        for name in _TUPLE_FIELDS:
            if isinstance(payload.get(name), list):
                payload[name] = tuple(payload[name])
        try:
            return cls(**payload)
        except TypeError as exc:
            raise JobSpecError(f"job payload is incomplete: {exc}") from None


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(JobSpec))
_TUPLE_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec) if f.default == ())
_OPTIONAL_DEFAULTS = {"packages": True, "skills_dir": "", "github": False, "backend": "", "chain_pi_tree": "",
                      "publish_to": ""}
# What only the container reads: the texts, and the event context (it copies comment and review text).
CONTAINER_ONLY_FIELDS = ("title", "body", "comment", "instructions", "task", "context")


def forget_container_texts(job) -> None:
    """Blanks the container-only fields of an ended RQ job's payload, in memory. Called just before RQ
    writes the job's final state (finished, failed, stopped), which then stores the payload without them:
    RQ keeps a finished job for PI_FINISHED_JOB_TTL_SECONDS and a failed one for PI_FAILED_JOB_TTL_SECONDS.
    The payload stays readable (ids, target) for the fleet panel and the run record's fallbacks."""
    try:
        args = job.args
    except DeserializationError:
        return  # nothing of it can be read, nor rewritten: RQ keeps the bytes it has
    if not args or not isinstance(args[0], dict):
        return
    blank = {name: {} if name == "context" else "" for name in CONTAINER_ONLY_FIELDS if name in args[0]}
    job.args = ({**args[0], **blank}, *args[1:])


def job_time_budget_seconds() -> int:
    """The longest one attempt may take: the clone's git calls (at most three), the container's limit, and
    room for the gates and the record. RQ's own timeout and the concurrency leases are sized from it."""
    return settings.PI_JOB_TIMEOUT_SECONDS + 3 * settings.PI_CLONE_TIMEOUT_SECONDS + 300


@dataclass(frozen=True)
class Claim:
    """A key held for `window_ms` by the first job that claims it: a later job claiming the same key is
    swallowed (the receiver's dedup layers), and `reason` says why. The key holds `holder`, the claimer's job
    id unless given (a delivery's replicas share one), so the same holder claiming again (a retried
    delivery) passes."""

    key: str
    window_ms: int
    reason: str
    holder: str = ""


@dataclass(frozen=True)
class Enqueued:
    status: str  # "created" | "existing" (the job id was taken) | "swallowed" (a claim is another job's)
    surviving: str = ""  # swallowed: the holder of the claim
    claim: Claim | None = None  # swallowed: the claim that did it

    @property
    def created(self) -> bool:
        return self.status == "created"


# The claims, the queue's registration and RQ's unique save-and-push in one atomic round trip (three with
# `Queue.enqueue_call` plus a separate SET NX). It writes RQ's keys exactly as rq 3.0's unique enqueue
# does (rq is pinned; tests run jobs enqueued this way through a real rqworker). Every claim is read before
# any is taken, so a job swallowed by one claim takes none of the others.
_ENQUEUE_SCRIPT = """
-- KEYS: job hash, queue list, RQ's set of queues, then one key per claim
-- ARGV: job id, job ttl (-1: none), the number of claims, then each claim's window in ms and holder, then
--       the job hash's field/value pairs
local claims = tonumber(ARGV[3])
for i = 1, claims do
    local holder = redis.call("GET", KEYS[3 + i])
    if holder and holder ~= ARGV[3 + 2 * i] then
        return {"swallowed", holder, i}
    end
end
for i = 1, claims do
    redis.call("SET", KEYS[3 + i], ARGV[3 + 2 * i], "NX", "PX", ARGV[2 + 2 * i])
end
redis.call("SADD", KEYS[3], KEYS[2])
if redis.call("EXISTS", KEYS[1]) == 1 then
    return {"existing", "", 0}
end
redis.call("HSET", KEYS[1], unpack(ARGV, 4 + 2 * claims))
local ttl = tonumber(ARGV[2])
if ttl > 0 then
    redis.call("EXPIRE", KEYS[1], ttl)
end
redis.call("RPUSH", KEYS[2], ARGV[1])
return {"created", "", 0}
"""


@cache
def _enqueue_script(connection):
    return connection.register_script(_ENQUEUE_SCRIPT)


UNREPLICATED_KEY = "pidispatch:redis:unreplicated"  # how many enqueues no replica confirmed in time (/metrics)


def _run_enqueue(connection, job_id: str, keys: list, args: list):
    """The enqueue script; with PI_REDIS_MIN_REPLICAS, on the same connection (WAIT counts that connection's
    writes) followed by WAIT, so the 2xx behind it waits until that many replicas hold the job. Past
    PI_REDIS_REPLICA_WAIT_MS the job stays queued: its accepted row lets the reconciler queue it again should a
    failover lose it, and the warning says so."""
    wanted = settings.PI_REDIS_MIN_REPLICAS
    if wanted <= 0:
        return _enqueue_script(connection)(keys=keys, args=args)
    with connection.pipeline(transaction=False) as pipe:
        _enqueue_script(connection)(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", wanted, settings.PI_REDIS_REPLICA_WAIT_MS)
        result, replicas = pipe.execute()
    if int(replicas) < wanted:
        logger.warning("redis_unreplicated job=%s replicas=%s wanted=%s waited_ms=%s: queued on the primary and "
                       "recorded in the database; a failover now would have the reconciler queue it again",
                       job_id, replicas, wanted, settings.PI_REDIS_REPLICA_WAIT_MS)
        with contextlib.suppress(RedisError):
            connection.incr(UNREPLICATED_KEY)
    return result


def project_of(spec: JobSpec) -> str:
    """The project the job's target is a member of now (a forge repository forge-qualified, a folder normalised)."""
    from apps.worker.gates.scopes import job_scopes
    from apps.worker.models import Project

    project = Project.objects.containing(job_scopes(spec))
    return project.slug if project is not None else ""


def enqueue(spec: JobSpec, queue_name: str, claims: tuple[Claim, ...] = (), *, attempts_made: int = 0,
            rebuilt: bool = False) -> Enqueued:
    """Enqueue one job, atomically unique on its id (and on each of `claims`, checked in order), stamped with
    its project (project_of), and recorded as accepted (apps/worker/accepted.py) once Redis holds it, so a Redis
    that loses it gets it back. `rebuilt`: a job Redis lost, queued again from its row as it was accepted (its
    project stamp kept, its row there already) after the `attempts_made` its records show.

    Redis errors propagate: the caller decides whether the work is kept for later (the inbox) or lost. So do
    database errors: what could not be recorded is not acknowledged.
    """
    if not spec.project and not rebuilt:
        spec = dataclasses.replace(spec, project=project_of(spec))
    connection = get_redis()
    queue = Queue(queue_name, connection=connection)
    job = queue.create_job(
        JOB_FUNCTION,
        args=(spec.to_payload(),),
        job_id=spec.job_id,
        description=spec.job_id,  # RQ logs the description; the default would print the payload
        timeout=job_time_budget_seconds(),
        result_ttl=settings.PI_FINISHED_JOB_TTL_SECONDS,
        failure_ttl=settings.PI_FAILED_JOB_TTL_SECONDS,
    )
    queue._prepare_for_queue(job)  # origin, enqueued_at, status: what RQ's enqueue sets before saving
    if attempts_made:
        job.number_of_retries = attempts_made  # RQ counts attempts from it: the next one is attempts_made + 1
    keys = [job.key, queue.key, queue.redis_queues_keys, *(claim.key for claim in claims)]
    args = [job.id, job.ttl if job.ttl is not None else -1, len(claims),
            *(part for claim in claims for part in (claim.window_ms, claim.holder or job.id)),
            *_build_hset_args(job)]
    status, surviving, claimed = _run_enqueue(connection, spec.job_id, keys, args)
    status, surviving = text(status), text(surviving)
    if status == "swallowed":
        return Enqueued(status, surviving, claims[int(claimed) - 1])
    if status == "created":
        logger.info("job_enqueued job=%s queue=%s target=%s", spec.job_id, queue_name, spec.target)
    if not rebuilt:
        accepted.accept(spec.job_id, queue_name, spec.to_payload())
    return Enqueued(status, surviving)
