"""Who may point a trigger at a skills folder, and where (issue 46 §1): a skills folder is a worker host's folder
copied into every job of its trigger, so it is judged at save against the roots the host declares
(PI_SKILLS_ROOTS), by the admin, the API and the importer alike, and setting one is a permission of its own
(`receiver.set_skills_dir`) beside managing triggers. The worker judges it again when it picks a job up
(tests/worker/test_skills_folder.py)."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client

from apps.access import tokens
from apps.receiver.models import Trigger

pytestmark = pytest.mark.django_db

ROOT = "/srv/pi-skills"
LABEL = {"type": "label", "any": ["pi"]}
RULE = {"on": LABEL, "run": {"kind": "github", "flow": "fix-bug", "skillsDir": f"{ROOT}/review"}}
PLAIN = {"on": LABEL, "run": {"kind": "github", "flow": "fix-bug"}}
MANAGE = ("receiver.manage_triggers", "receiver.view_trigger")
SKILLS = "receiver.set_skills_dir"


@pytest.fixture(autouse=True)
def skills_roots(settings):
    settings.PI_SKILLS_ROOTS = (ROOT,)


def user_with(name: str, *permissions: str, staff=False) -> User:
    user = User.objects.create_user(name, password="x", is_staff=staff)
    for dotted in permissions:
        app, codename = dotted.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)


def api(user) -> Client:
    _, token = tokens.issue(user, name="test", scope="admin")
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


def patch(client, path, body):
    return client.patch(path, data=json.dumps(body), content_type="application/json")


def stored() -> list[str]:
    return list(Trigger.objects.order_by("position").values_list("skills_dir", flat=True))


# --- the API ----------------------------------------------------------------------------------------------------------

def test_a_trigger_manager_without_the_permission_cannot_point_a_trigger_at_a_skills_folder():
    manager = api(user_with("manager", *MANAGE))

    answer = post(manager, "/api/v1/triggers", RULE)
    assert answer.status_code == 403 and SKILLS in answer.json()["detail"]
    assert not Trigger.objects.exists()

    plain = post(manager, "/api/v1/triggers", PLAIN)
    assert plain.status_code == 201
    answer = patch(manager, f"/api/v1/triggers/{plain.json()['id']}", {"run": RULE["run"]})
    assert answer.status_code == 403
    assert stored() == [""]


def test_with_the_permission_it_is_set_and_a_manager_may_still_change_the_rest_or_clear_it():
    setter = api(user_with("setter", *MANAGE, SKILLS))
    created = post(setter, "/api/v1/triggers", RULE)
    assert created.status_code == 201 and created.json()["run"]["skillsDir"] == f"{ROOT}/review"

    manager = api(user_with("manager", *MANAGE))
    path = f"/api/v1/triggers/{created.json()['id']}"
    assert patch(manager, path, {"note": "reviewed", "on": {"type": "label", "any": ["pi", "ai"]}}).status_code == 200
    assert stored() == [f"{ROOT}/review"]  # kept as it was: not a change of folder
    answer = patch(manager, path, {"run": {**RULE["run"], "skillsDir": f"{ROOT}/other"}})
    assert answer.status_code == 403 and stored() == [f"{ROOT}/review"]
    assert patch(manager, path, {"run": PLAIN["run"]}).status_code == 200  # clearing narrows what jobs get
    assert stored() == [""]


@pytest.mark.parametrize("folder", ["/etc", "/root/.ssh", "/proc/self", "/srv/pi-skills-elsewhere", f"{ROOT}/../x"])
def test_a_folder_outside_the_declared_roots_is_refused_at_save_naming_the_field(folder):
    setter = api(user_with("setter", *MANAGE, SKILLS))
    answer = post(setter, "/api/v1/triggers", {**RULE, "run": {**RULE["run"], "skillsDir": folder}})
    assert answer.status_code == 400
    assert "not under a root this host declares (PI_SKILLS_ROOTS" in json.dumps(answer.json())
    assert not Trigger.objects.exists()


def test_the_deployments_own_files_are_refused_at_save_whatever_the_roots_say(settings):
    from django.conf import settings as live

    settings.PI_SKILLS_ROOTS = ("/",)
    setter = api(user_with("setter", *MANAGE, SKILLS))
    for folder in (str(live.BASE_DIR / "pidispatch_site"), str(live.VAR_DIR), "/etc/pidispatch", "/proc/self"):
        answer = post(setter, "/api/v1/triggers", {**RULE, "run": {**RULE["run"], "skillsDir": folder}})
        assert answer.status_code == 400 and "pidispatch's own files" in json.dumps(answer.json()), folder
    assert not Trigger.objects.exists()


def test_without_declared_roots_no_skills_folder_is_accepted(settings):
    settings.PI_SKILLS_ROOTS = ()
    answer = post(api(user_with("setter", *MANAGE, SKILLS)), "/api/v1/triggers", RULE)
    assert answer.status_code == 400 and "declares no skills folder roots" in json.dumps(answer.json())


def test_an_import_that_sets_a_skills_folder_needs_the_permission_even_in_a_dry_run():
    manager = api(user_with("manager", *MANAGE))
    for path in ("/api/v1/triggers/import", "/api/v1/triggers/import?dry_run=true"):
        answer = post(manager, path, {"triggers": [PLAIN, RULE]})
        assert answer.status_code == 403, path
    assert not Trigger.objects.exists()

    setter = api(user_with("setter", *MANAGE, SKILLS))
    assert post(setter, "/api/v1/triggers/import", {"triggers": [PLAIN, RULE]}).status_code == 200
    # The same file again changes no folder: a manager may import it (an export round trip).
    assert post(manager, "/api/v1/triggers/import", {"triggers": [PLAIN, RULE]}).status_code == 200
    assert stored() == ["", f"{ROOT}/review"]


# --- the host's import command ----------------------------------------------------------------------------------------

def test_the_host_command_imports_a_skills_folder_under_the_roots_and_refuses_one_outside(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps({"triggers": [RULE]}))
    call_command("import_triggers", str(tmp_path / "t.json"), stdout=StringIO(), stderr=StringIO())
    assert stored() == [f"{ROOT}/review"]

    outside = {**RULE, "run": {**RULE["run"], "skillsDir": "/etc"}}
    (tmp_path / "bad.json").write_text(json.dumps({"triggers": [outside]}))
    with pytest.raises(CommandError, match="not under a root this host declares"):
        call_command("import_triggers", str(tmp_path / "bad.json"), stdout=StringIO(), stderr=StringIO())
    assert stored() == [f"{ROOT}/review"]


# --- the admin --------------------------------------------------------------------------------------------------------

ADMIN_FORM = {"position": 0, "enabled": "on", "on_type": "label", "label_any": '["pi"]', "label_all": "[]",
              "label_none": "[]", "kind": "github", "flow": "fix-bug", "note": "", "skills_dir": f"{ROOT}/review"}


def admin(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_in_the_admin_the_field_is_read_only_without_the_permission_and_a_post_cannot_set_it():
    manager = admin(user_with("manager", *MANAGE, staff=True))
    page = manager.get("/admin/receiver/trigger/add/?on_type=label").content.decode()
    assert 'name="skills_dir"' in page and "needs the permission receiver.set_skills_dir" in page
    assert manager.post("/admin/receiver/trigger/add/?on_type=label", ADMIN_FORM).status_code == 302
    assert stored() == [""]  # the posted folder was not taken

    setter = admin(user_with("setter", *MANAGE, SKILLS, staff=True))
    assert "needs the permission" not in setter.get("/admin/receiver/trigger/add/?on_type=label").content.decode()
    assert setter.post("/admin/receiver/trigger/add/?on_type=label", {**ADMIN_FORM, "position": 1}).status_code == 302
    assert stored() == ["", f"{ROOT}/review"]

    bad = setter.post("/admin/receiver/trigger/add/?on_type=label", {**ADMIN_FORM, "position": 2,
                                                                        "skills_dir": "/etc"})
    assert bad.status_code == 200 and "not under a root this host declares" in bad.content.decode()
    assert Trigger.objects.count() == 2
