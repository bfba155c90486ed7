"""Who may change what in the admin. A trigger chooses the folder, image and secret references of jobs on a
worker host, and scoped limits and the settings row what they may spend: changing them is a permission of
its own (superusers have it), never one granted with the apps' other permissions. Staff without it see them
read-only, and the settings page creates no row on a GET. Behind TLS (DJANGO_SECURE) cookies are
HTTPS-only and browsers get HSTS."""

import json
import os
import subprocess
import sys

import pytest
from django.apps import apps as installed_apps
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from apps.receiver.models import Trigger
from apps.worker.models import DispatchSettings, ScopedLimit
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

MANAGE = ("manage_triggers", "manage_limits", "manage_settings")
TRIGGER_FORM = {"position": 0, "enabled": "on", "on_type": "label", "label_any": '["pi"]', "label_all": "[]",
                "label_none": "[]", "kind": "github", "flow": "fix-bug", "image": "someone-elses:latest", "note": ""}


def staff_client(username: str, *codenames: str) -> Client:
    """A staff account holding every permission of the receiver and worker apps but the manage_* ones (an
    operators' group is often given "all of the app"), plus `codenames`; logged in."""
    user = User.objects.create_user(username, password="unused", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label__in=["receiver", "worker"])
                              .exclude(codename__in=MANAGE))
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_staff_without_the_permission_view_triggers_read_only_and_change_nothing(label_trigger):
    viewer = staff_client("viewer")
    page = f"/admin/receiver/trigger/{label_trigger.pk}/change/"

    listing = viewer.get("/admin/receiver/trigger/").content.decode()
    assert "fix-bug" in listing
    assert "Read only: changing these needs the permission “Can add, change and delete triggers" in listing
    assert 'name="_save"' not in viewer.get(page).content.decode()

    assert viewer.post(page, TRIGGER_FORM).status_code == 403
    assert viewer.post("/admin/receiver/trigger/add/", TRIGGER_FORM).status_code == 403
    assert viewer.post(f"/admin/receiver/trigger/{label_trigger.pk}/delete/", {"post": "yes"}).status_code == 403
    viewer.post("/admin/receiver/trigger/", {"action": "disable_selected", "_selected_action": [label_trigger.pk]})

    assert list(Trigger.objects.values_list("image", "enabled")) == [("", True)]


def test_staff_without_the_permission_change_no_limit_and_no_setting():
    viewer = staff_client("viewer")
    limit = ScopedLimit.objects.create(scope="acme/web", day=5)
    DispatchSettings.objects.create(daily_cap=5)

    assert viewer.get(f"/admin/worker/scopedlimit/{limit.pk}/change/").status_code == 200
    assert viewer.post(f"/admin/worker/scopedlimit/{limit.pk}/change/", {"scope": "acme/web", "day": 500,
                                                                        "note": ""}).status_code == 403
    assert viewer.post("/admin/worker/scopedlimit/add/", {"scope": "acme/api", "day": 500,
                                                         "note": ""}).status_code == 403
    assert viewer.post(f"/admin/worker/scopedlimit/{limit.pk}/delete/", {"post": "yes"}).status_code == 403
    settings_page = viewer.get("/admin/worker/dispatchsettings/", follow=True).content.decode()
    assert "daily cap: 5" in settings_page and "Read only" in settings_page
    assert viewer.post("/admin/worker/dispatchsettings/1/change/", {"daily_cap": 500}).status_code == 403

    assert list(ScopedLimit.objects.values_list("scope", "day")) == [("acme/web", 5)]
    assert DispatchSettings.objects.get().daily_cap == 5


def test_a_get_of_the_settings_page_creates_no_row():
    nobody = Client()
    nobody.force_login(User.objects.create_user("nobody", password="unused", is_staff=True))
    assert nobody.get("/admin/worker/dispatchsettings/").status_code == 403

    viewer_page = staff_client("viewer").get("/admin/worker/dispatchsettings/", follow=True)
    assert viewer_page.status_code == 200 and "Read only" in viewer_page.content.decode()
    manager = staff_client("manager", "manage_settings")
    assert manager.get("/admin/worker/dispatchsettings/").url == "/admin/worker/dispatchsettings/1/change/"
    assert manager.get("/admin/worker/dispatchsettings/add/").url == "/admin/worker/dispatchsettings/1/change/"

    assert not DispatchSettings.objects.exists()


def test_the_manage_permissions_let_staff_change_them(label_trigger):
    manager = staff_client("manager", *MANAGE)

    assert "Read only" not in manager.get("/admin/receiver/trigger/").content.decode()
    assert manager.post(f"/admin/receiver/trigger/{label_trigger.pk}/change/", TRIGGER_FORM).status_code == 302
    manager.post("/admin/receiver/trigger/", {"action": "disable_selected", "_selected_action": [label_trigger.pk]})
    limit = {"scope": "acme/api", "day": 3, "note": ""}
    assert manager.post("/admin/worker/scopedlimit/add/", limit).status_code == 302
    assert manager.post("/admin/worker/dispatchsettings/1/change/", {"daily_cap": 7, "job_memory": ""}).status_code \
        == 302

    assert list(Trigger.objects.values_list("image", "enabled")) == [("someone-elses:latest", False)]
    assert ScopedLimit.objects.get().day == 3 and DispatchSettings.objects.get().daily_cap == 7


def test_upgrading_retires_the_old_model_permissions_and_their_holders_keep_viewing():
    """A database from before: Django's add/change/delete permissions of the trigger exist and are held."""
    from pidispatch_site.permissions import retire_change_permissions

    content_type = ContentType.objects.get_for_model(Trigger)
    change = Permission.objects.create(content_type=content_type, codename="change_trigger", name="Can change trigger")
    delete = Permission.objects.create(content_type=content_type, codename="delete_trigger", name="Can delete trigger")
    user = User.objects.create_user("operator", password="unused", is_staff=True)
    user.user_permissions.add(change)
    group = Group.objects.create(name="operators")
    group.permissions.add(delete)

    retire_change_permissions("receiver", "trigger").code(installed_apps, None)

    held = {(holder, permission.codename) for holder, permissions in
            (("user", user.user_permissions.all()), ("group", group.permissions.all())) for permission in permissions}
    assert held == {("user", "view_trigger"), ("group", "view_trigger")}
    assert set(Permission.objects.filter(content_type=content_type).values_list("codename", flat=True)) == {
        "view_trigger", "manage_triggers", "set_skills_dir"}


SECURE_PROBE = """
import json, django
django.setup()
from django.conf import settings
from django.test import Client
answers = {}
for scheme, headers in (("https", {"HTTP_X_FORWARDED_PROTO": "https"}), ("http", {})):
    response = Client(**headers).get("/admin/login/")
    answers[scheme] = {"hsts": response.headers.get("Strict-Transport-Security"),
                       "secure_csrf_cookie": bool(response.cookies["csrftoken"]["secure"])}
answers["secure_session_cookie"] = settings.SESSION_COOKIE_SECURE
print(json.dumps(answers))
"""


def served(**env) -> dict:
    """The admin's login page as a fresh process serves it, over the proxy's HTTPS and over plain HTTP."""
    result = subprocess.run([sys.executable, "-c", SECURE_PROBE], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "DJANGO_SETTINGS_MODULE": "pidispatch_site.settings",
                                 "DJANGO_ALLOWED_HOSTS": "testserver", **env}, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_behind_tls_cookies_are_https_only_and_browsers_get_hsts():
    secure = served(DJANGO_SECURE="true")
    assert secure == {"https": {"hsts": "max-age=31536000", "secure_csrf_cookie": True},
                      "http": {"hsts": None, "secure_csrf_cookie": True},  # HSTS only means something over HTTPS
                      "secure_session_cookie": True}

    plain = served(DJANGO_SECURE="false")
    assert plain == {"https": {"hsts": None, "secure_csrf_cookie": False},  # nobody's word for HTTPS is taken
                     "http": {"hsts": None, "secure_csrf_cookie": False}, "secure_session_cookie": False}
