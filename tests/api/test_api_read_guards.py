"""What a caller may read: HEAD and OPTIONS take the check GET takes (HEAD runs the GET handler), on the plain views
and the viewsets alike; the OpenAPI schema and its docs page are served to signed-in users and tokens only, unless
PI_API_SCHEMA_PUBLIC opens them."""

import pytest
from django.contrib.auth.models import Permission, User

from apps.access import tokens

pytestmark = pytest.mark.django_db

# Every GET-able view, and the permission its GET needs.
READ_VIEWS = [("/api/v1/settings", "worker.view_dispatchsettings"), ("/api/v1/spend", "worker.view_run"),
              ("/api/v1/reasons", "worker.view_run"), ("/api/v1/fleet", "fleet.view_fleet"),
              ("/api/v1/fleet/hosts", "fleet.view_fleet"), ("/api/v1/fleet/queues", "fleet.view_fleet"),
              ("/api/v1/jobs/gh-nothing", "fleet.view_fleet"), ("/api/v1/runs", "worker.view_run"),
              ("/api/v1/limits", "worker.view_scopedlimit"), ("/api/v1/triggers", "receiver.view_trigger"),
              ("/api/v1/deliveries", "receiver.view_delivery")]


def bearer(user, scope="admin") -> dict:
    _, token = tokens.issue(user, name="reader", scope=scope)
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def user_with(name, *dotted) -> User:
    user = User.objects.create_user(name, password="x")
    for permission in dotted:
        app, codename = permission.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)


@pytest.mark.parametrize("path, permission", READ_VIEWS, ids=[path for path, _ in READ_VIEWS])
def test_head_and_options_take_the_check_get_takes(client, path, permission, redis_conn):
    nobody = bearer(user_with("nobody"))
    for method in (client.get, client.head, client.options):
        answer = method(path, **nobody)
        assert answer.status_code == 403, (method.__name__, answer.status_code)

    reader = bearer(user_with("reader", permission), scope="read")
    for method in (client.get, client.head, client.options):
        assert method(path, **reader).status_code in (200, 404), method.__name__  # 404: the job that is not there
    assert client.head(path).status_code == 401


def test_head_and_options_on_a_view_without_get_are_refused(client, redis_conn):
    canceller = bearer(user_with("canceller", "fleet.cancel_job"))
    assert client.options("/api/v1/jobs/gh-nothing/cancel", **canceller).status_code == 403
    assert client.head("/api/v1/jobs/gh-nothing/cancel", **canceller).status_code in (403, 405)


@pytest.mark.parametrize("path", ["/api/v1/schema/", "/api/v1/docs/"])
def test_the_schema_is_for_signed_in_users_and_tokens(client, settings, path):
    assert client.get(path).status_code == 401

    assert client.get(path, **bearer(user_with("someone"), scope="read")).status_code == 200
    client.force_login(User.objects.create_user("staff", password="x", is_staff=True))
    assert client.get(path).status_code == 200
    client.logout()

    settings.PI_API_SCHEMA_PUBLIC = True
    assert client.get(path).status_code == 200
