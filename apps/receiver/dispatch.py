"""From a match to queued jobs: JobSpecs (one per replica), the dedup layers, routing, enqueue.

Three dedup layers, the ancestor's two and a replay guard:
- exact: the job id is derived from the delivery id and RQ's enqueue is atomic-unique on it (a forge's own
  redelivery keeps its id; the inbox answers it before it gets here);
- replayed body: a delivery whose raw body started jobs within PI_REPLAY_WINDOW_SECONDS is swallowed
  whatever its id (GitHub's and Forgejo's signatures do not cover the delivery id, so a captured delivery
  could be resent under fresh ids). The claim `pidispatch:replay:<forge>:<sha256 of the body>` holds the
  delivery's first job id, which all its replicas share;
- semantic: a second delivery for the same forge, target and flow inside PI_DEDUP_WINDOW_SECONDS is swallowed
  (`pidispatch:dedup:<key>`, holding the claiming job's own id). It coalesces re-label spam and a forge's rapid
  repeats. A job started by a comment (or a review) is keyed by its text as well (`:c<keyed digest>`): the same
  comment delivered twice coalesces, a new comment on the same target is a new request and never swallowed,
  not even by the labelled job of three minutes ago. Keyed by the text rather than by "only while the earlier
  job has not started": that needs no job-state read in the enqueue's atomic step, works the same on all four
  forges (none of which names a comment id the same way), and what a writer asks again in other words is new.
Each job takes its claims in the same atomic round trip as its enqueue, and a claim's value names the
surviving job. A retry of the same delivery (after Redis went away halfway) passes its own claims and
converges on exactly the jobs it should have made.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass, field

from django.conf import settings

from apps.fleet import routing
from apps.fleet.queues import SHARED_QUEUE
from apps.worker.jobs import Claim, JobSpec, delivery_job_id, delivery_part, enqueue

from . import run_keys
from .hooks.base import ForgeEvent
from .matching import Match

logger = logging.getLogger("pidispatch.receiver")

DEDUP_KEY_PREFIX = "pidispatch:dedup:"
REPLAY_KEY_PREFIX = "pidispatch:replay:"
REPLAYED_BODY = "replayed-body"
DEDUP_WINDOW = "dedup-window"


def job_specs(event: ForgeEvent, match: Match) -> list[JobSpec]:
    """The jobs a match starts: one, or `run.replicas` of them (`<id>-r<i>`)."""
    rule = match.trigger
    context = {
        "event": event.event,
        "action": event.action,
        "deliveryId": event.delivery_id,
        "sender": {"id": event.actor.id},
        "matched": match.matched,
    }
    if event.route == "comment":
        context["comment"] = {"body": event.comment}
        if event.forge == "github":
            context["comment"]["author_association"] = event.actor.association
    if event.review is not None:
        context["review"] = dict(event.review)
    once = bool(rule.once and match.close)
    fields = {
        **run_keys.job_fields(rule),  # what the rule's `run` says; the event and the match say the rest
        "kind": event.forge,
        "repo": event.repo or f"{event.project}/{rule.repository}",
        "target_type": event.target_type,
        "number": event.number,
        "project_id": event.project_id,
        "repository_id": event.repository_id,
        "head": dict(event.head),
        "base": dict(event.base),
        "flow": match.flow,
        "command": match.command,
        "title": event.title,
        "body": event.body,
        "comment": event.comment,
        "once": once,
        "once_armed_at": rule.armed_at.isoformat() if once and rule.armed_at else "",
        "delivery_id": event.delivery_id,
        "trigger_id": rule.pk,
        "trigger_type": rule.on_type,
        "context": context,
    }
    if not rule.replicas:
        return [JobSpec(**{**fields, "job_id": delivery_job_id(event.forge, event.delivery_id), "replicas": None})]
    return [
        JobSpec(**{**fields, "job_id": delivery_job_id(event.forge, event.delivery_id, replica=i), "replica": i})
        for i in range(1, rule.replicas + 1)
    ]


def semantic_key(spec: JobSpec) -> str:
    """`<forge>:<repo>#<n>:<flow>` (`!` for merge/pull requests on GitLab and Azure), `cmd:<command>` for
    commands, `closed:` before the slot for close jobs, `:c<digest>` for a comment's (or review's) text,
    `:r<i>` for replicas. The forge is part of the target:
    `acme/web` on GitHub and on a Forgejo are two repositories."""
    slot = spec.flow or f"cmd:{spec.command}"
    if spec.context.get("matched", {}).get("action") in ("closed", "close") or spec.trigger_type == "issue":
        slot = f"closed:{slot}"
    key = f"{spec.kind}:{spec.target}:{slot}"
    if spec.comment:
        key += f":c{comment_digest(spec.comment)}"
    return f"{key}:r{spec.replica}" if spec.replica is not None else key


def comment_digest(text: str) -> str:
    """A comment's text as 16 hex digits, keyed by the deployment's secret: a Redis key never shows the text,
    nor lets anyone with the keyspace guess a short comment by hashing candidates."""
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]


def capability_needs(spec: JobSpec) -> frozenset[str]:
    """Host capabilities the job binds: `secrets:<profile>` and `wait:<profile>` for each waitFor profile."""
    needs = {f"secrets:{spec.secrets_profile}"} if spec.secrets_profile else set()
    needs.update(f"wait:{condition['profile']}" for condition in spec.wait_for
                 if isinstance(condition, dict) and isinstance(condition.get("profile"), str))
    return frozenset(needs)


def queue_for(spec: JobSpec) -> str:
    needs = capability_needs(spec)
    if not needs:
        return SHARED_QUEUE  # the common case: no registry read at all
    try:
        return routing.queue_for(needs, job_id=spec.job_id)  # the job id spreads replicas over capable hosts
    except Exception:  # routing must never drop work: any doubt goes to the shared queue
        logger.warning("job_route_failed job=%s needs=%s", spec.job_id, ",".join(sorted(needs)))
        return SHARED_QUEUE


@dataclass
class DispatchResult:
    created: list[str] = field(default_factory=list)  # new jobs
    existing: list[str] = field(default_factory=list)  # this delivery's jobs that already existed
    swallowed: list[tuple[str, str, str]] = field(default_factory=list)  # (job id, surviving job id, reason)

    @property
    def job_ids(self) -> list[str]:
        # Replicas swallowed by a replayed body all name the first delivery's first job: once is enough.
        return list(dict.fromkeys(self.created + self.existing + [surviving for _, surviving, _ in self.swallowed]))

    @property
    def all_swallowed(self) -> bool:
        return bool(self.swallowed) and not self.created and not self.existing

    @property
    def swallowed_reason(self) -> str:
        reasons = {reason for _, _, reason in self.swallowed}
        return REPLAYED_BODY if REPLAYED_BODY in reasons else DEDUP_WINDOW


def claims_for(spec: JobSpec, body_digest: str) -> tuple[Claim, ...]:
    """The replayed-body claim, then the semantic one (each only while its window is on)."""
    claims = []
    if settings.PI_REPLAY_WINDOW_SECONDS > 0:
        # Every job of a delivery holds the claim under one name, its first job's (`-r1` for replicas), so
        # the delivery's replicas and its retries pass it.
        first_job = delivery_job_id(spec.kind, spec.delivery_id, replica=1 if spec.replica is not None else None)
        claims.append(Claim(f"{REPLAY_KEY_PREFIX}{spec.kind}:{body_digest}", settings.PI_REPLAY_WINDOW_SECONDS * 1000,
                            REPLAYED_BODY, holder=first_job))
    if settings.PI_DEDUP_WINDOW_SECONDS > 0:
        claims.append(Claim(DEDUP_KEY_PREFIX + semantic_key(spec), settings.PI_DEDUP_WINDOW_SECONDS * 1000,
                            DEDUP_WINDOW))
    return tuple(claims)


def dispatch(specs: list[JobSpec], body: bytes) -> DispatchResult:
    """Enqueue each spec (of the delivery whose raw `body` is given) with its claims, routed. Redis errors
    propagate (the caller keeps the delivery pending); what was done before the error is convergent on retry."""
    body_digest = hashlib.sha256(body).hexdigest()  # only a delivery that starts work pays for it
    result = DispatchResult()
    for spec in specs:
        enqueued = enqueue(spec, queue_for(spec), claims_for(spec, body_digest))
        if enqueued.status == "swallowed":
            result.swallowed.append((spec.job_id, enqueued.surviving, enqueued.claim.reason))
            logger.info("job_deduplicated delivery=%s job=%s surviving=%s reason=%s",
                        delivery_part(spec.delivery_id), spec.job_id, enqueued.surviving, enqueued.claim.reason)
        elif enqueued.created:
            result.created.append(spec.job_id)
        else:
            result.existing.append(spec.job_id)
    return result
