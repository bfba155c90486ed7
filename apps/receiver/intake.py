"""The intake service: store a verified delivery in the inbox, decide, enqueue, and say what happened.

One home for a delivery's state changes. The webhook views call `receive`; a replay of a pending
delivery calls `process` on the stored row.
"""

import logging
from dataclasses import dataclass

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone
from redis.exceptions import RedisError

from apps.fleet.queues import SHARED_QUEUE
from apps.worker.jobs import enqueue

from .forge_config import forge_config
from .hooks import github
from .hooks.base import HookRefused, parse_json_object
from .matching import decide
from .models import Delivery, DeliveryStatus

logger = logging.getLogger("pidispatch.receiver")

NORMALISERS = {"github": github.normalise}


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict


def _self_id(forge: str) -> str:
    return getattr(forge_config(), forge).self_id


def receive(forge: str, event: str, delivery_id: str, raw_body: bytes) -> Answer:
    """A verified delivery whose body is a JSON object. Stored first, then processed."""
    try:
        with transaction.atomic():
            delivery = Delivery.objects.create(forge=forge, delivery_id=delivery_id, event=event, payload=raw_body)
    except IntegrityError:
        existing = Delivery.objects.filter(forge=forge, delivery_id=delivery_id).first()
        logger.info("delivery_duplicate forge=%s delivery=%s", forge, delivery_id)
        return Answer(202, {"status": "duplicate", "jobs": existing.job_ids if existing else []})
    except DatabaseError:
        logger.error("delivery_store_failed forge=%s delivery=%s", forge, delivery_id)
        return Answer(503, {"error": "store-failed"})
    return process(delivery)


def _finish(delivery: Delivery, status: str, reason: str = "", job_ids=None) -> None:
    delivery.status = status
    delivery.reason = reason
    if job_ids is not None:
        delivery.job_ids = job_ids
    delivery.payload = None  # the texts leave the inbox as soon as the delivery is settled
    delivery.processed_at = timezone.now()
    delivery.save(update_fields=["status", "reason", "job_ids", "payload", "processed_at"])


def process(delivery: Delivery) -> Answer:
    forge, delivery_id = delivery.forge, delivery.delivery_id
    try:
        payload = parse_json_object(bytes(delivery.payload))
        event = NORMALISERS[forge](delivery.event, delivery_id, payload)
    except HookRefused as refused:
        _finish(delivery, DeliveryStatus.REJECTED, refused.error)
        logger.info("delivery_rejected forge=%s delivery=%s reason=%s", forge, delivery_id, refused.error)
        return Answer(refused.status, {"error": refused.error})

    decision = decide(event, _self_id(forge))
    if not decision.specs:
        _finish(delivery, DeliveryStatus.IGNORED, decision.reason)
        logger.info("delivery_ignored forge=%s delivery=%s reason=%s", forge, delivery_id, decision.reason)
        return Answer(200, {"status": "ignored", "reason": decision.reason})

    job_ids, created = [], []
    try:
        for spec in decision.specs:
            job_ids.append(spec.job_id)
            if enqueue(spec, SHARED_QUEUE):
                created.append(spec.job_id)
    except RedisError:
        # Keep the payload: the delivery is enqueued when Redis is back. The forge still gets a 2xx,
        # because GitHub, GitLab and Forgejo never redeliver by themselves.
        delivery.status = DeliveryStatus.PENDING
        delivery.save(update_fields=["status"])
        logger.warning("delivery_pending forge=%s delivery=%s reason=redis-unavailable", forge, delivery_id)
        return Answer(202, {"status": "accepted"})

    _finish(delivery, DeliveryStatus.QUEUED, job_ids=job_ids)
    status = "queued" if created else "duplicate"
    logger.info("delivery_%s forge=%s delivery=%s jobs=%s", status, forge, delivery_id, ",".join(job_ids))
    return Answer(202, {"status": status, "jobs": job_ids})
