"""The inbox says what became of each delivery's jobs, not only how intake went."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rq import Queue

from apps.receiver.models import Delivery
from apps.worker.models import Run

pytestmark = pytest.mark.django_db


def failed_twice(job_id: str) -> None:
    now = timezone.now()
    for attempt, reason in ((1, "runner-infra"), (2, "container-exit-unknown")):
        Run.objects.create(job_id=job_id, attempt=attempt, kind="github", target="acme/web#7", started_at=now,
                           ended_at=now + timedelta(seconds=3), outcome="failed", reason=reason, exit_code=3)


def test_a_queued_delivery_whose_job_failed_twice_shows_failed_with_a_link(admin_client, redis_conn):
    failed_twice("gh-failed-1")
    Queue("pi-jobs", connection=redis_conn).enqueue("builtins.print", job_id="gh-waiting-1")
    delivery = Delivery.objects.create(forge="github", delivery_id="d-1", event="issues", status="queued",
                                       job_ids=["gh-failed-1", "gh-waiting-1", "gh-vanished-1"])

    listing = admin_client.get("/admin/receiver/delivery/").content.decode()
    assert "gh-failed-1 · failed (container-exit-unknown)" in listing
    assert "/admin/worker/run/?job_id=gh-failed-1" in listing
    assert "gh-waiting-1 · queued" in listing
    assert "gh-vanished-1 · unknown" in listing

    page = admin_client.get(f"/admin/receiver/delivery/{delivery.pk}/change/").content.decode()
    assert "gh-failed-1 · failed (container-exit-unknown)" in page and "Jobs now" in page


def test_the_inbox_still_shows_recorded_outcomes_when_redis_is_down(admin_client, settings):
    failed_twice("gh-failed-2")
    Delivery.objects.create(forge="github", delivery_id="d-2", event="issues", status="queued",
                            job_ids=["gh-failed-2"])
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there

    listing = admin_client.get("/admin/receiver/delivery/")
    assert listing.status_code == 200
    assert "gh-failed-2 · failed (container-exit-unknown)" in listing.content.decode()


def test_admin_times_carry_seconds_and_the_zone(admin_client):
    delivery = Delivery.objects.create(forge="github", delivery_id="d-3", event="issues", status="queued")
    page = admin_client.get(f"/admin/receiver/delivery/{delivery.pk}/change/").content.decode()
    assert delivery.received_at.strftime("%Y-%m-%d %H:%M:%S UTC") in page
