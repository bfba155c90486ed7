"""The admin's front page: branded, sections in the order of use, and a status strip that says what state the
system is in (fleet, hosts, jobs, spend, inbox) even when Redis is down."""

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.fleet import pauses, registry
from apps.receiver.models import Delivery
from apps.worker.models import DispatchSettings, Run

pytestmark = pytest.mark.django_db


def host(redis_conn, name="hostA"):
    registry.publish(redis_conn, registry.HostFacts(name=name, declared=True, version="0.1.0", image="img"),
                     registry.ProcessFacts(worker_name=f"w-{name}", pid=1, proc="x/y/1/1", started_at=time.time(),
                                           queues=("pi-jobs", f"pi-jobs@{name}")))


def test_the_index_is_branded_and_ordered_by_use(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert "Django administration" not in page and "pidispatch" in page
    sections = [page.index(f'class="app-{label} module') for label in ("fleet", "worker", "receiver", "auth")]
    assert sections == sorted(sections)
    assert 'href="/admin/"' in page  # "View site" is the admin itself, not a 404
    assert 'href="/admin/insight/spend/" id="link-cost"' in page and 'href="/admin/fleet/fleetpanel/"' in page


def test_the_index_links_only_the_pages_its_user_may_open(client):
    from django.contrib.auth.models import Permission, User

    clerk = User.objects.create_user("clerk", password="pw", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="view_delivery"))
    client.force_login(clerk)
    page = client.get("/admin/").content.decode()
    assert 'id="link-cost"' not in page and 'href="/admin/fleet/fleetpanel/"' not in page


def test_the_strip_says_paused_by_whom_and_why_and_counts_the_day(admin_client, admin_user, redis_conn):
    host(redis_conn)
    pauses.pause(redis_conn, ["pi-jobs"], by="admin", note="provider outage")
    now = timezone.now()
    for job_id in ("gh-f1", "gh-f2"):
        Run.objects.create(job_id=job_id, kind="github", started_at=now, ended_at=now, outcome="failed",
                           reason="runner-infra", cost="0.00420000")
    Run.objects.create(job_id="gh-old", kind="github", started_at=now - timedelta(days=2),
                       ended_at=now - timedelta(days=2), outcome="failed", reason="runner-infra")
    Delivery.objects.create(forge="github", delivery_id="p-1", status="pending")

    page = admin_client.get("/admin/").content.decode()
    strip = re.sub(r"\s+", " ", page[page.index('id="status-strip"'):page.index('id="home-links"')])
    assert "PART PAUSED" in strip and "paused by admin: “provider outage”" in strip
    assert re.search(r'id="strip-hosts">.*?<span class="big ">1</span> of 1', strip)
    assert "2 failed today" in strip
    assert "$0.0084" in strip
    assert re.search(r'status__exact=pending" class="big warn">1</a> pending', strip)


def test_the_strip_survives_redis_being_down(admin_client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = admin_client.get("/admin/")
    page = response.content.decode()
    assert response.status_code == 200
    assert "Redis unreachable" in page and "0 pending" in re.sub(r"<[^>]+>|\s+", " ", page).replace("  ", " ")


def test_the_settings_singleton_offers_no_second_add_once_it_exists(admin_client):
    DispatchSettings.objects.create(daily_cap=3)
    page = admin_client.get("/admin/").content.decode()
    assert "/admin/worker/dispatchsettings/add/" not in page


def test_start_a_run_is_linked_for_those_who_may(admin_client, client, django_user_model):
    assert 'id="link-start-run"' in admin_client.get("/admin/").content.decode()
    django_user_model.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    client.login(username="viewer", password="pw-viewer-123")
    assert 'id="link-start-run"' not in client.get("/admin/").content.decode()
    assert client.get("/admin/start-run/").status_code == 403
