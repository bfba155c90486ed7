"""Sending notifications: the one home of every change to a delivery.

    notify(Event.FAILURE, job_id, document)     one delivery per enabled endpoint that takes the event, queued
    deliver_again(delivery)                      the admin's "Deliver again" on a failed one
    send_test(endpoint)                          the admin's "Send a test notification"

A delivery is made once per endpoint, event and subject (a job id, a budget window): a second notify of the same is
a no-op. Its sending is an RQ job on the `pi-notify` queue (`manage.py notify_worker` works it, never a job's
worker, which only writes the row and enqueues), tried PI_NOTIFY_ATTEMPTS times in all with a doubling backoff;
`delivery.py` makes each try and records it. Nothing here raises into the caller: a worker recording a run must
never be held up or failed by a notification (a delivery Redis could not take stays `pending`, with a log line).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone
from redis.exceptions import RedisError
from rq import Queue, Retry

from apps.fleet.connection import get_redis

from .models import Endpoint, Event, Notification, NotificationStatus

logger = logging.getLogger("pidispatch.notifications")

NOTIFY_QUEUE = "pi-notify"
DELIVER_FUNCTION = "apps.notifications.delivery.deliver"
FLAGS = {Event.FAILURE: "on_failure", Event.SOFT_HOLD: "on_soft_hold"}


def retry_policy() -> Retry | None:
    retries = settings.PI_NOTIFY_ATTEMPTS - 1
    if retries < 1:
        return None
    base = settings.PI_NOTIFY_RETRY_SECONDS
    return Retry(max=retries, interval=[base * 2**i for i in range(retries)])


def enqueue(delivery: Notification) -> bool:
    """Queue the sending of `delivery`; False (logged) when Redis did not take it."""
    try:
        Queue(NOTIFY_QUEUE, connection=get_redis()).enqueue_call(
            DELIVER_FUNCTION, args=(delivery.pk,), job_id=f"notify-{delivery.pk}-{delivery.attempts}",
            description=f"notify-{delivery.pk}", retry=retry_policy(), result_ttl=3600, failure_ttl=7 * 24 * 3600,
            timeout=int(settings.PI_NOTIFY_TIMEOUT_SECONDS) + 60)
    except RedisError:
        logger.warning("notification_not_queued delivery=%s event=%s why=redis-unavailable", delivery.pk,
                       delivery.event)
        return False
    return True


def notify(event: str, subject: str, document: dict) -> list[Notification]:
    """One delivery per enabled endpoint taking `event`, unless one was made for this subject already."""
    made = []
    try:
        endpoints = list(Endpoint.objects.filter(enabled=True, **{FLAGS[Event(event)]: True}))
        for endpoint in endpoints:
            try:
                with transaction.atomic():
                    delivery = Notification.objects.create(endpoint=endpoint, event=event, subject=subject,
                                                       document=document, created_at=timezone.now())
            except IntegrityError:
                continue  # this endpoint was told about this subject already
            made.append(delivery)
    except DatabaseError:
        logger.warning("notification_not_recorded event=%s subject=%s why=database", event, subject)
        return made
    for delivery in made:
        if enqueue(delivery):
            logger.info("notification_queued delivery=%s endpoint=%s event=%s subject=%s", delivery.pk,
                        delivery.endpoint_id, event, subject)
    return made


def deliver_again(delivery: Notification) -> bool:
    """A failed (or stuck pending) delivery, queued once more with a fresh set of tries."""
    if delivery.status == NotificationStatus.DELIVERED:
        return False
    Notification.objects.filter(pk=delivery.pk).update(status=NotificationStatus.PENDING, finished_at=None)
    delivery.status, delivery.finished_at = NotificationStatus.PENDING, None
    return enqueue(delivery)


def send_test(endpoint: Endpoint) -> Notification:
    """A test notification to one endpoint (a subject of its own each time)."""
    now = timezone.now()
    delivery = Notification.objects.create(endpoint=endpoint, event=Event.FAILURE,
                                           subject=f"test-{now.timestamp():.6f}",
                                       document={"test": True, "jobId": "test", "outcome": "failed",
                                                 "reason": "test-notification"}, created_at=now)
    enqueue(delivery)
    return delivery


# --- what sends them ---------------------------------------------------------------------------------------------

def on_run_recorded(sender, run, spec, **kwargs) -> None:
    """`apps.worker.records.run_recorded` receiver: the failure hook's events, to the endpoints."""
    from apps.worker import failure_hook

    try:
        if failure_hook.pages_for(run):
            notify(Event.FAILURE, run.job_id, failure_hook.document(run))
    except Exception:  # a notification must never fail the job's recording
        logger.exception("notification_failed job=%s", run.job_id)


def on_soft_hold(sender, window: str, period: str, job_id: str, **kwargs) -> None:
    """`apps.worker.gates.budget.soft_hold_reached` receiver: once per window and period."""
    notify(Event.SOFT_HOLD, f"{window}:{period}", {"event": "soft-hold", "window": window, "period": period,
                                                    "jobId": job_id, "reason": "soft-hold"})
