"""The fleet panel as a test drives it: its URL, a host row in the registry, staff with given permissions,
and CSRF-checked posts."""

import time

from django.contrib.auth.models import Permission, User
from django.test import Client

from apps.fleet import registry

PANEL = "/admin/fleet/fleetpanel/"


def publish(redis_conn, name, job=None, capabilities=()):
    registry.publish(
        redis_conn,
        registry.HostFacts(name=name, declared=True, version="0.1.0", image="pidispatch-demo:latest",
                           capabilities=tuple(capabilities)),
        registry.ProcessFacts(worker_name=f"w-{name}", pid=1, proc="x/y/1/1", started_at=time.time() - 600,
                              queues=("pi-jobs", f"pi-jobs@{name}"), job=job),
    )


def staff(*perms) -> Client:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fleet", codename__in=perms))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_post(client: Client, path: str, data: dict):
    client.get(PANEL)
    return client.post(path, {**data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value}, follow=True)
