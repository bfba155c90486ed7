"""The inbox service: the one home of a delivery's state changes.

    receive()     the webhook views: store (before anything slow, or settled at once), answer the forge
    process()     decide, check authority, enqueue, settle (or keep pending)
    replay()      one stored delivery again (admin action, `replay_deliveries`)
    replay_due()  everything that is due, in arrival order (`replay_deliveries [--follow]`)
    discard()     an operator gives up on a pending delivery

The rule: a verified delivery is stored before anything slow happens to it, and a 2xx answer waits for exactly
one fsync, the one that holds the delivery (Redis's for a queued delivery, the database's last write for every
other outcome). Why, and how SQLite and PostgreSQL keep it: docs/architecture.md, "The inbox row and its fsync
ordering rule".
"""

from __future__ import annotations

import base64
import json
import logging
import traceback
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from redis.exceptions import RedisError

from apps import forge_registry
from apps.fleet.connection import get_redis
from apps.worker.jobs import delivery_part
from apps.worker.models import Run
from pidispatch_site import rowwrites

from . import authority, rulebook
from .dispatch import dispatch, job_specs
from .forge_config import identity_at_hand, self_identity
from .hooks.base import HookRefused, parse_json_object
from .matching import decide
from .models import Delivery, DeliveryStatus

logger = logging.getLogger("pidispatch.receiver")

NORMALISERS = {name: forge_registry.hook(name).normalise for name in forge_registry.NAMES}
SPOOL_KEY = "pidispatch:inbox:spool"
REDIS_UNAVAILABLE = "redis-unavailable"
# A `duplicate` answer names the rule that applied: this one (the forge sent a delivery id it sent before), or
# dispatch's `dedup-window` (same target, flow and comment text inside the window) or `replayed-body`.
REDELIVERY_RULE = "delivery-id"
STALE_RECEIVED = timedelta(minutes=2)  # a "received" row this old lost its process (crash, killed worker)
FIRST_BACKOFF_SECONDS = 15


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict

    @property
    def outcome(self) -> str:
        return self.body.get("status") or "rejected"


ACCEPTED = Answer(202, {"status": "accepted"})


# --- the web path ------------------------------------------------------------------------------------------

class Redelivered(Exception):
    """The delivery's first write found its row already there: the forge sent it again."""


def receive(forge: str, event: str, delivery_id: str, raw_body: bytes, payload: dict | None = None) -> Answer:
    """A verified delivery whose body is a JSON object (`payload`, when already parsed). Its row is written
    by process(), before anything slow happens to it, or whole once its outcome is known."""
    now = timezone.now()
    try:
        return _process_safely(_arrived(forge, event, delivery_id, raw_body, now), payload, raw_body)
    except Redelivered:
        return _answer_redelivery(forge, event, delivery_id, raw_body, now)


def _arrived(forge: str, event: str, delivery_id: str, raw_body: bytes, now: datetime) -> Delivery:
    """A verified delivery as it arrived, its row not yet written."""
    return Delivery(forge=forge, delivery_id=delivery_id, event=event, payload=raw_body, attempts=1,
                    attempted_at=now)


def _write(delivery: Delivery, names: tuple[str, ...], *, wait_for_disk: bool) -> None:
    """The row's next state: its first write inserts the whole row, a later one updates `names`."""
    if delivery.pk is None:
        _insert(delivery, wait_for_disk=wait_for_disk)
    else:
        rowwrites.update(delivery, names, wait_for_disk=wait_for_disk)


def _insert(delivery: Delivery, *, wait_for_disk: bool) -> None:
    """The row's first write; Redelivered when the forge's delivery id is in the inbox already."""
    try:
        # In autocommit the insert is its own transaction; inside an outer one (tests, ATOMIC_REQUESTS) a
        # savepoint keeps a duplicate's IntegrityError from breaking it.
        with transaction.atomic() if connection.in_atomic_block else nullcontext():
            rowwrites.insert(delivery, wait_for_disk=wait_for_disk)
    except IntegrityError as error:
        raise Redelivered from error


def _store(delivery: Delivery) -> None:
    """Before anything slow or outside this process (learning our identity, a lookup, an enqueue): the row
    with its payload, so a crash of this process loses nothing (the replayer takes stale "received" rows).
    It does not wait for the disk: the outcome's write does, or the job does (module docstring)."""
    if delivery.pk is None:
        _insert(delivery, wait_for_disk=False)


def _process_safely(delivery: Delivery, payload: dict | None = None, raw_body: bytes | None = None) -> Answer:
    """process(), but a verified delivery is never answered with a 5xx: whatever goes wrong, it is kept.
    `raw_body`: the web path's delivery, whose row is not yet known to be on disk (or not yet written)."""
    try:
        return process(delivery, payload)
    except Redelivered:
        raise
    except DatabaseError:
        if delivery.pk is not None:  # stored, not settled: the replayer picks up stale "received" rows
            logger.error("delivery_processing_interrupted forge=%s delivery=%s reason=database", delivery.forge,
                         delivery_part(delivery.delivery_id))
        return _kept_unsettled(delivery, raw_body)
    except Exception as error:  # a bug of ours must not lose the delivery (nor print its text)
        # Where, not what: frame names only (a message or a source line could quote payload text).
        frames = ",".join(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}:{frame.name}"
                          for frame in traceback.extract_tb(error.__traceback__)[-4:])
        logger.error("delivery_processing_error forge=%s delivery=%s error=%s at=%s", delivery.forge,
                     delivery_part(delivery.delivery_id), type(error).__name__, frames)
        if delivery.pk is None:  # a settle that failed before its insert changed it: pend it as it arrived
            delivery = _arrived(delivery.forge, delivery.event, delivery.delivery_id, raw_body, delivery.attempted_at)
        try:
            return _pend(delivery, "processing-error")
        except DatabaseError:
            return _kept_unsettled(delivery, raw_body)


def _kept_unsettled(delivery: Delivery, raw_body: bytes | None) -> Answer:
    """The database failed before the delivery was settled or pended: its row is not written, or written
    without waiting for the disk. Before the forge hears "accepted" the raw delivery is spooled to Redis; the
    replayer moves it into the inbox, or drops it when it finds the row and replays that. (A replay has no
    forge waiting and spools nothing.)"""
    if raw_body is None:
        return ACCEPTED
    if delivery.pk is None:
        return _spool(delivery.forge, delivery.event, delivery.delivery_id, raw_body, delivery.attempted_at)
    return _spool(delivery.forge, delivery.event, delivery.delivery_id, raw_body, delivery.received_at,
                  reason="database-error")


def _answer_redelivery(forge: str, event: str, delivery_id: str, raw_body: bytes, now: datetime) -> Answer:
    """The first answer again. A row that is not settled or pending is still in another process's hands and
    may not be on disk yet, so this "accepted" spools a copy first, as `_kept_unsettled` does."""
    try:
        existing = Delivery.objects.filter(forge=forge, delivery_id=delivery_id).first()
    except DatabaseError:
        return _spool(forge, event, delivery_id, raw_body, now, reason="database-error")
    logger.info("delivery_redelivered forge=%s delivery=%s status=%s", forge, delivery_part(delivery_id),
                existing.status if existing else "-")
    if existing is None or existing.status == DeliveryStatus.RECEIVED:
        return _spool(forge, event, delivery_id, raw_body, now, reason="in-flight")
    if existing.status == DeliveryStatus.PENDING:
        return ACCEPTED  # a pend waits for the disk
    if existing.status == DeliveryStatus.IGNORED:
        return Answer(200, {"status": "ignored", "reason": existing.reason})
    if existing.status == DeliveryStatus.REJECTED:
        return Answer(400, {"error": existing.reason})
    if existing.status == DeliveryStatus.DISCARDED:
        return Answer(200, {"status": "ignored", "reason": "discarded"})
    return Answer(202, {"status": "duplicate", "rule": REDELIVERY_RULE, "jobs": existing.job_ids})


def _spool(forge: str, event: str, delivery_id: str, raw_body: bytes, now: datetime,
           reason: str = "database-unavailable") -> Answer:
    """Keep the raw delivery in Redis until the replayer moves it into the inbox: the database is down, or the
    delivery's row is not known to be on disk (the replayer drops the copy when it finds the row)."""
    entry = {"forge": forge, "event": event, "delivery_id": delivery_id, "received_at": now.isoformat(),
             "payload": base64.b64encode(raw_body).decode()}
    try:
        get_redis().rpush(SPOOL_KEY, json.dumps(entry))
    except RedisError:
        logger.error("delivery_store_failed forge=%s delivery=%s reason=database-and-redis-down", forge,
                     delivery_part(delivery_id))
        return Answer(503, {"error": "store-failed"})
    logger.warning("delivery_spooled forge=%s delivery=%s reason=%s", forge, delivery_part(delivery_id), reason)
    return ACCEPTED


# --- deciding ------------------------------------------------------------------------------------------------

def _settle(delivery: Delivery, status: str, reason: str = "", job_ids=None, *, replay_safe: bool = False) -> None:
    """The outcome is final and the payload goes.

    `replay_safe`: every job the delivery asked for is queued (none swallowed), so Redis holds the delivery
    on disk, and undoing this settle could only make the delivery replay onto the same job ids, which RQ's
    unique id, the dedup claim and `_jobs_that_ran` stop from running twice. Such a settle does not wait for
    the disk. Any other outcome is the delivery's only durable record, and replayed after a power cut it could
    be decided anew (rules changed, a dedup window over), so it waits.
    """
    delivery.status = status
    delivery.reason = reason
    if job_ids is not None:
        delivery.job_ids = job_ids
    delivery.payload = None  # the texts leave the inbox as soon as the delivery is settled
    delivery.processed_at = timezone.now()
    delivery.next_attempt_at = None
    _write(delivery, ("status", "reason", "job_ids", "payload", "processed_at", "next_attempt_at"),
           wait_for_disk=not replay_safe)


def _backoff(delivery: Delivery, reason: str, at_least: float = 0) -> timedelta:
    """The inbox's own backoff, and never sooner than the forge asked (`at_least`: its Retry-After, bounded)."""
    if reason in (REDIS_UNAVAILABLE, "database-unavailable"):
        return timedelta(0)  # the replayer waits for Redis itself, then goes in arrival order
    seconds = FIRST_BACKOFF_SECONDS * 2 ** max(0, min(delivery.attempts - 1, 16))
    return timedelta(seconds=max(min(seconds, settings.PI_INBOX_MAX_BACKOFF_SECONDS), at_least))


def _pend(delivery: Delivery, reason: str, at_least: float = 0) -> Answer:
    delivery.status = DeliveryStatus.PENDING
    delivery.reason = reason
    delivery.next_attempt_at = timezone.now() + _backoff(delivery, reason, at_least)
    _write(delivery, ("status", "reason", "next_attempt_at"), wait_for_disk=True)  # before the forge's answer
    logger.warning("delivery_pending forge=%s delivery=%s reason=%s attempts=%s", delivery.forge,
                   delivery_part(delivery.delivery_id), reason, delivery.attempts)
    return ACCEPTED


def process(delivery: Delivery, payload: dict | None = None) -> Answer:
    forge, delivery_id = delivery.forge, delivery.delivery_id
    logged_id = delivery_part(delivery_id)  # charset-safe: an id's spaces and `=` cannot forge log fields
    try:
        if payload is None:
            payload = parse_json_object(bytes(delivery.payload))
        event = NORMALISERS[forge](delivery.event, delivery_id, payload)
    except HookRefused as refused:
        _settle(delivery, DeliveryStatus.REJECTED, refused.error)
        logger.info("delivery_rejected forge=%s delivery=%s reason=%s", forge, logged_id, refused.error)
        return Answer(refused.status, {"error": refused.error})

    if not identity_at_hand(forge):
        _store(delivery)  # learning it asks the forge
    identity = self_identity(forge)
    if identity is None:
        return _pend(delivery, "identity-unknown")

    decision = decide(event, identity, rulebook.forge_rules())
    match = decision.match
    if match is None:
        return _ignore(delivery, decision.reason)

    _store(delivery)
    if match.authority:
        verdict = authority.check(event, match.authority)
        if verdict.allowed is None:
            logger.warning("authority_lookup_failed forge=%s delivery=%s lookup=%s reason=%s", forge, logged_id,
                           match.authority, verdict.reason)
            return _pend(delivery, authority.PENDING_REASONS[forge], at_least=verdict.retry_after or 0)
        if not verdict.allowed:
            return _ignore(delivery, match.refusal)

    specs = job_specs(event, match)
    ran = _jobs_that_ran(specs) if delivery.attempts > 1 else set()
    try:
        result = dispatch([spec for spec in specs if spec.job_id not in ran], bytes(delivery.payload))
    except RedisError:
        # Keep the payload: the delivery is enqueued when Redis is back. The forge still gets a 2xx,
        # because GitHub, GitLab and Forgejo never redeliver by themselves.
        return _pend(delivery, REDIS_UNAVAILABLE)

    result.existing += [spec.job_id for spec in specs if spec.job_id in ran]
    job_ids = result.job_ids
    if result.all_swallowed:
        _settle(delivery, DeliveryStatus.DUPLICATE, result.swallowed_reason, job_ids=job_ids)
        logger.info("delivery_duplicate forge=%s delivery=%s surviving=%s reason=%s", forge, logged_id,
                    ",".join(job_ids), result.swallowed_reason)
        return Answer(202, {"status": "duplicate", "rule": result.swallowed_reason, "jobs": job_ids})
    _settle(delivery, DeliveryStatus.QUEUED, job_ids=job_ids, replay_safe=not result.swallowed)
    logger.info("delivery_queued forge=%s delivery=%s target=%s jobs=%s created=%s", forge, logged_id,
                f"{event.repo or event.project}:{event.number}", ",".join(job_ids), len(result.created))
    return Answer(202, {"status": "queued", "jobs": job_ids})


def _jobs_that_ran(specs) -> set[str]:
    """A replayed delivery's jobs that already have a run record. RQ forgets a finished job after
    PI_FINISHED_JOB_TTL_SECONDS and the semantic claim after the dedup window, so only the record can stop a
    late replay (a settle lost in a power cut, a crashed process's stale row) from running a job again."""
    return set(Run.objects.filter(job_id__in=[spec.job_id for spec in specs]).values_list("job_id", flat=True))


def _ignore(delivery: Delivery, reason: str) -> Answer:
    _settle(delivery, DeliveryStatus.IGNORED, reason)
    logger.info("delivery_ignored forge=%s delivery=%s reason=%s", delivery.forge,
                delivery_part(delivery.delivery_id), reason)
    return Answer(200, {"status": "ignored", "reason": reason})


# --- replay ------------------------------------------------------------------------------------------------

def _claim(delivery: Delivery) -> bool:
    """Take a stored delivery for processing; False when another process took it first."""
    now = timezone.now()
    claimed = Delivery.objects.filter(
        pk=delivery.pk, status__in=(DeliveryStatus.PENDING, DeliveryStatus.RECEIVED), attempts=delivery.attempts,
        payload__isnull=False,
    ).update(status=DeliveryStatus.RECEIVED, attempts=F("attempts") + 1, attempted_at=now)
    if claimed:
        delivery.refresh_from_db()
    return bool(claimed)


def replay(delivery: Delivery) -> Answer | None:
    """Process a stored delivery again. None when it holds no payload any more or another process has it."""
    if delivery.payload is None or not _claim(delivery):
        return None
    return _process_safely(delivery)


def discard(delivery: Delivery) -> bool:
    """An operator gives up on an unsettled delivery: its payload is deleted, the row remains."""
    changed = Delivery.objects.filter(
        pk=delivery.pk, status__in=(DeliveryStatus.PENDING, DeliveryStatus.RECEIVED)
    ).update(status=DeliveryStatus.DISCARDED, reason="operator-discard", payload=None, processed_at=timezone.now(),
             next_attempt_at=None)
    if changed:
        logger.info("delivery_discarded forge=%s delivery=%s", delivery.forge, delivery_part(delivery.delivery_id))
    return bool(changed)


def drain_spool() -> int:
    """Move deliveries spooled to Redis (while the database was down) into the inbox, oldest first."""
    redis, moved = get_redis(), 0
    while True:
        raw = redis.lindex(SPOOL_KEY, 0)
        if raw is None:
            return moved
        try:
            entry = json.loads(raw)
            received_at = parse_datetime(entry["received_at"]) or timezone.now()
            with transaction.atomic():
                delivery = Delivery.objects.create(
                    forge=entry["forge"], delivery_id=entry["delivery_id"], event=entry["event"],
                    payload=base64.b64decode(entry["payload"]), status=DeliveryStatus.PENDING,
                    reason="database-unavailable", next_attempt_at=received_at,
                )
                Delivery.objects.filter(pk=delivery.pk).update(received_at=received_at)
            moved += 1
        except IntegrityError:
            pass  # in the inbox already: moved before (and the process died before it popped the entry),
            # or the web path's copy of a row it could not settle (_kept_unsettled)
        except (ValueError, KeyError, TypeError):
            logger.error("delivery_spool_entry_unreadable")
        except DataError:
            # A value the database refuses (never a database that is down: that is OperationalError and
            # keeps the entry). Leaving it at the head would block every delivery behind it.
            logger.error("delivery_spool_entry_unstorable")
        redis.lpop(SPOOL_KEY)


UNLOGGED_QUEUE_WARNING = (
    "Redis runs without its append-only file (appendonly no): if Redis dies, the jobs queued since its last "
    "snapshot are gone, and the inbox has already settled their deliveries. Set `appendonly yes` and "
    "`appendfsync always` in redis.conf."
)
UNSYNCED_QUEUE_WARNING = (
    "Redis syncs its append-only file only now and then (appendfsync {policy}): a power cut can lose the jobs "
    "of the deliveries answered in its last second or so, and the inbox has already settled them. Set "
    "`appendfsync always` in redis.conf (writes that arrive together share one fsync)."
)


def queue_durability_warning() -> str | None:
    """What to tell the operator when Redis could lose jobs whose deliveries the inbox has settled; None when
    it keeps them (or its settings cannot be read: a managed Redis may disable CONFIG)."""
    try:
        config = get_redis().config_get("append*")
    except RedisError:
        return None
    if config.get("appendonly") == "no":
        return UNLOGGED_QUEUE_WARNING
    policy = config.get("appendfsync")
    if policy and policy != "always":
        return UNSYNCED_QUEUE_WARNING.format(policy=policy)
    return None


@dataclass
class ReplayReport:
    moved_from_spool: int = 0
    outcomes: dict | None = None
    redis_down: bool = False

    def count(self, outcome: str) -> None:
        self.outcomes = self.outcomes or {}
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def due_deliveries(now: datetime | None = None, *, ignore_backoff: bool = False):
    now = now or timezone.now()
    pending = Q(status=DeliveryStatus.PENDING)
    if not ignore_backoff:
        pending &= Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    stale = Q(status=DeliveryStatus.RECEIVED, attempted_at__lt=now - STALE_RECEIVED)
    return Delivery.objects.holding_payload().filter(pending | stale).replay_order()


def replay_due(*, ignore_backoff: bool = False, limit: int = 500, on_replayed=None) -> ReplayReport:
    """One pass: the spool into the inbox, then every due delivery in arrival order. While Redis is down
    nothing is processed (order is kept for when it returns)."""
    report = ReplayReport()
    try:
        get_redis().ping()
        report.moved_from_spool = drain_spool()
    except RedisError:
        report.redis_down = True
        return report
    for delivery in due_deliveries(ignore_backoff=ignore_backoff)[:limit]:
        answer = replay(delivery)
        if answer is None:
            continue
        report.count(answer.outcome)
        if on_replayed is not None:
            on_replayed(delivery, answer)
        if answer.outcome == "accepted" and Delivery.objects.filter(pk=delivery.pk, reason=REDIS_UNAVAILABLE).exists():
            report.redis_down = True  # Redis went away again: stop, keep the rest in order
            break
    return report
