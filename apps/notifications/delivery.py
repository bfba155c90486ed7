"""One try of one delivery, run by `manage.py notify_worker` (an RQ job on `pi-notify`).

The body is the delivery's document (JSON style: `{"event", "subject", "delivery", "data": {...}}`; Slack style:
`{"text": "..."}` of the same ids), POSTed with `Content-Type: application/json`, `X-Pidispatch-Event`,
`X-Pidispatch-Notification`, `X-Pidispatch-Timestamp` (unix seconds) and, when the endpoint names a signing secret,
`X-Pidispatch-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>." + body>`. Each try judges the URL again
(destination.py: the name resolved now, every address public or named in PI_NOTIFY_INTERNAL_HOSTS) and connects to
the address it judged. A 2xx answer delivers it; anything else (an error status, a redirect, which is never
followed, a timeout, a refused connection, an internal address, the secret's variable unset) is recorded as a try and
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

import certifi
import urllib3
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rq import get_current_job

from .destination import DestinationRefused, judge
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
        destination = judge(endpoint.url)
    except DestinationRefused as refused:
        logger.warning("notification_refused endpoint=%s why=%s", endpoint.pk, refused.reason)
        return None, refused.reason
    pool = _pool(destination)
    try:
        answer = pool.urlopen("POST", destination.target, body=body,
                              headers={**headers, "Host": destination.host_header}, redirect=False, retries=False,
                              assert_same_host=False, preload_content=False)
    except urllib3.exceptions.NewConnectionError:
        return None, "unreachable"
    except urllib3.exceptions.TimeoutError:
        return None, "timeout"
    except urllib3.exceptions.SSLError:
        return None, "tls-refused"
    except urllib3.exceptions.HTTPError:
        return None, "unreachable"
    finally:
        pool.close()
    answer.release_conn()
    return answer.status, "" if 200 <= answer.status < 300 else f"http-{answer.status}"


def _pool(destination) -> urllib3.HTTPConnectionPool:
    """A connection to the judged address, never the name resolved again; TLS checks the certificate against the
    name the URL gave."""
    timeout = urllib3.Timeout(total=settings.PI_NOTIFY_TIMEOUT_SECONDS)
    if destination.scheme == "https":
        return urllib3.HTTPSConnectionPool(destination.address, destination.port, timeout=timeout, maxsize=1,
                                           cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                                           server_hostname=destination.host, assert_hostname=destination.host)
    return urllib3.HTTPConnectionPool(destination.address, destination.port, timeout=timeout, maxsize=1)


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
