"""One try of one delivery, run by `manage.py notify_worker` (an RQ job on `pi-notify`).

The body is the delivery's document (JSON style: `{"event", "subject", "delivery", "data": {...}}`; Slack style:
`{"text": "..."}` of the same ids), POSTed with `Content-Type: application/json`, `X-Pidispatch-Event`,
`X-Pidispatch-Notification`, `X-Pidispatch-Timestamp` (unix seconds) and, when the endpoint names a signing secret,
`X-Pidispatch-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>." + body>`. A 2xx answer delivers it; anything else
(an error status, a redirect, a timeout, a refused connection, the secret's variable unset) is recorded as a try and
raised, so RQ tries again as the job's retry policy says; the last try marks the delivery failed. Every try leaves a
NotificationAttempt row (status code or error token, and how long it took): never the answer's body, never the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time

import requests
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rq import get_current_job

from .models import Notification, NotificationAttempt, NotificationStatus, Style

logger = logging.getLogger("pidispatch.notifications")


class DeliveryFailed(Exception):
    """A try that did not deliver: RQ retries the job (ids and a token only in its message)."""


def body_of(delivery: Notification) -> bytes:
    document = delivery.document
    if delivery.endpoint.style == Style.SLACK:
        parts = [f"pidispatch: {delivery.event}", document.get("jobId") or "", document.get("outcome") or "",
                 f"({document['reason']})" if document.get("reason") else "", document.get("target") or "",
                 f"on {document['host']}" if document.get("host") else "", document.get("runUrl") or ""]
        if delivery.event == "soft-hold":
            parts = [f"pidispatch: the {document.get('window')} budget window from {document.get('period')} "
                     f"reached its soft hold; new runs wait for the next window"]
        return json.dumps({"text": " ".join(part for part in parts if part)}).encode()
    return json.dumps({"event": delivery.event, "subject": delivery.subject, "delivery": delivery.pk,
                       "data": document}, sort_keys=True).encode()


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _post(delivery: Notification) -> tuple[int | None, str]:
    """(status code, error token) of one POST."""
    endpoint = delivery.endpoint
    body = body_of(delivery)
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": "pidispatch-notify",
               "X-Pidispatch-Event": delivery.event, "X-Pidispatch-Notification": str(delivery.pk),
               "X-Pidispatch-Timestamp": timestamp}
    if endpoint.secret_variable:
        secret = os.environ.get(endpoint.secret_variable, "")
        if not secret:
            return None, "secret-unset"
        headers["X-Pidispatch-Signature"] = sign(secret.encode(), timestamp, body)
    try:
        answer = requests.post(endpoint.url, data=body, headers=headers, timeout=settings.PI_NOTIFY_TIMEOUT_SECONDS,
                               allow_redirects=False)
    except requests.Timeout:
        return None, "timeout"
    except requests.ConnectionError:
        return None, "unreachable"
    except requests.RequestException as error:
        return None, type(error).__name__.lower()[:64]
    answer.close()
    return answer.status_code, "" if 200 <= answer.status_code < 300 else f"http-{answer.status_code}"


def deliver(delivery_pk: int) -> str:
    delivery = Notification.objects.select_related("endpoint").get(pk=delivery_pk)
    if delivery.status == NotificationStatus.DELIVERED:
        return delivery.status
    started = time.monotonic()
    status_code, error = _post(delivery)
    now = timezone.now()
    job = get_current_job()
    last = job is None or not job.retries_left
    with transaction.atomic():
        delivery = Notification.objects.select_for_update().get(pk=delivery_pk)
        delivery.attempts += 1
        NotificationAttempt.objects.create(notification=delivery, number=delivery.attempts, at=now,
                                           status_code=status_code, error=error,
                                           duration_ms=int((time.monotonic() - started) * 1000))
        if not error:
            delivery.status, delivery.finished_at = NotificationStatus.DELIVERED, now
        elif last:
            delivery.status, delivery.finished_at = NotificationStatus.FAILED, now
        delivery.save(update_fields=["attempts", "status", "finished_at"])
    logger.info("notification_try delivery=%s endpoint=%s try=%d result=%s", delivery.pk, delivery.endpoint_id,
                delivery.attempts, error or f"http-{status_code}")
    if error:
        raise DeliveryFailed(f"delivery {delivery.pk}: {error}")
    return delivery.status
