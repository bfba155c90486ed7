"""Enqueueing the children a completed run asked for: the one place a chained job is made.

    result = collect(spec, outbox_folder, chainable=frozenset({"review"}))
    result.children    # the children's job ids (enqueued now, or already by an earlier attempt)
    result.refusals    # {reason token: count}

A child is an ordinary job on its parent's target: a local parent's folder on the parent's host (its host queue
when the host is declared; forced when its parent was, since it starts from its parent's uncommitted work), or a
forge parent's issue or pull request (the shared queue; it is cloned and published like any forge job). It takes
the parent's image and the limits that can only lower a cap (max turns, max cost, excluded tools); never its
secrets, secret profile, provider, model, wait conditions, instructions or comment text.
It carries the `.pi/` the chain's first job started on (`chain_pi_tree`, skills.pi_digest), and runs only while its
workspace holds that one (`chain-pi-changed`): no agent of the chain rewrites the skills or the chainable flows of
the jobs after it. Its id is `chain-<16 hex>` of the parent's id, flow and task: an attempt run again that asks
the same again finds its children already queued (enqueue is unique on the id), so a chain never grows twice from
one request.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from redis.exceptions import RedisError

from apps.fleet.hosts import this_host
from apps.fleet.queues import SHARED_QUEUE, host_queue
from apps.worker.chaining import outbox
from apps.worker.jobs import FORGE_KINDS, JobSpec, chain_job_id, enqueue

logger = logging.getLogger("pidispatch.chaining")


@dataclass(frozen=True)
class ChainResult:
    children: tuple[str, ...] = ()
    refusals: dict[str, int] = field(default_factory=dict)


NOTHING = ChainResult()


def enabled_for(spec: JobSpec) -> bool:
    """Whether this job gets an /outbox: chaining is on (PI_CHAIN_DEPTH_MAX > 0)."""
    return settings.PI_CHAIN_DEPTH_MAX > 0


def may_have_children(spec: JobSpec) -> bool:
    """Whether a request of this job could pass the depth cap (only then are its flows' skills read)."""
    return enabled_for(spec) and spec.chain_depth + 1 <= settings.PI_CHAIN_DEPTH_MAX


def child_spec(spec: JobSpec, request: outbox.Request, pi_tree: str = "") -> JobSpec:
    """The child's spec; `pi_tree` the `.pi/` its parent started on, which is the chain's first job's."""
    common = dict(job_id=chain_job_id(spec.job_id, request.flow, request.task), kind=spec.kind, flow=request.flow,
                  task=request.task, image=spec.image, max_turns=spec.max_turns, max_cost_usd=spec.max_cost_usd,
                  models=spec.models, exclude_tools=spec.exclude_tools, skills_dir=spec.skills_dir,
                  packages=spec.packages, backend=spec.backend, trigger_type="chain", parent_job_id=spec.job_id,
                  chain_depth=spec.chain_depth + 1, chain_pi_tree=spec.chain_pi_tree or pi_tree,
                  context={"event": "chain", "parentJobId": spec.job_id, "chainDepth": spec.chain_depth + 1})
    if spec.kind == "local":
        # A forced parent's child is forced too: it starts from its parent's work, committed or not.
        return JobSpec(folder=spec.folder, target_type="local", force=spec.force, **common)
    return JobSpec(repo=spec.repo, target_type=spec.target_type, number=spec.number, project_id=spec.project_id,
                   repository_id=spec.repository_id, head=spec.head, base=spec.base, title=spec.title,
                   body=spec.body, delivery_id=spec.delivery_id, **common)


def child_queue(spec: JobSpec) -> str:
    if spec.kind in FORGE_KINDS:
        return SHARED_QUEUE
    here = this_host()  # the folder is on this host: its child runs here too
    return host_queue(here.name) if here.declared else SHARED_QUEUE


def collect(spec: JobSpec, folder: Path | None, chainable: frozenset[str], pi_tree: str = "") -> ChainResult:
    """Read the outbox of a completed run and enqueue its children. Never raises: a fault is a refusal token."""
    if folder is None or not enabled_for(spec):
        return NOTHING
    try:
        found = outbox.read(folder, settings.PI_CHAIN_MAX_PER_JOB)
    except OSError:
        logger.warning("chain_collect_error job=%s", spec.job_id)
        return ChainResult(refusals={"chain-collect-error": 1})
    refusals: Counter = Counter(found.refusals)
    children = []
    for request in found.requests:
        reason = _refusal(spec, request, chainable)
        if reason:
            refusals[reason] += 1
            logger.info("chain_refused job=%s file=%s flow=%s reason=%s", spec.job_id, request.name, request.flow,
                        reason)
            continue
        child = child_spec(spec, request, pi_tree)
        queue = child_queue(spec)
        try:
            status = enqueue(child, queue).status
        except RedisError:
            refusals["chain-collect-error"] += 1
            logger.warning("chain_enqueue_failed job=%s child=%s why=redis", spec.job_id, child.job_id)
            continue
        children.append(child.job_id)
        logger.info("chain_enqueued job=%s child=%s flow=%s depth=%d queue=%s status=%s", spec.job_id,
                    child.job_id, child.flow, child.chain_depth, queue, status)
    for reason, count in found.refusals.items():
        logger.info("chain_refused job=%s reason=%s count=%d", spec.job_id, reason, count)
    return ChainResult(children=tuple(dict.fromkeys(children)), refusals=dict(sorted(refusals.items())))


def _refusal(spec: JobSpec, request: outbox.Request, chainable: frozenset[str]) -> str:
    if spec.chain_depth + 1 > settings.PI_CHAIN_DEPTH_MAX:
        return "chain-depth-cap"
    if request.flow not in chainable:
        return "chain-gate-deny"
    return ""
