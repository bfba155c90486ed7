"""A run on a folder of a worker host is an administrator's power: `POST /api/v1/runs {"folder": ...}` needs a token
with the admin scope and its user's `worker.start_folder_run` (an operate token starts forge runs only), and a
refused folder answers one fixed reason, `folder-not-allowed`, whatever the host found there. The admin's "Start a
run" page takes the same permission."""

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

from apps.access import tokens
from tests.local_repos import OWNER, committed_repository

pytestmark = pytest.mark.django_db

START_RUN = ("worker", "start_run")
START_FOLDER_RUN = ("worker", "start_folder_run")
FOLDER_NOT_ALLOWED = {"error": "invalid", "fields": {"folder": ["folder-not-allowed"]}}


def user_with(name, *permissions, **fields) -> User:
    user = User.objects.create_user(name, password="x", **fields)
    for app, codename in permissions:
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)


def post_run(client, user, scope, body):
    _, token = tokens.issue(user, name="folder-runs", scope=scope)
    return client.post("/api/v1/runs", data=body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def queued(redis_conn) -> list[bytes]:
    return redis_conn.keys("rq:job:*")


@pytest.fixture
def outside_repo():
    base = Path(tempfile.mkdtemp(prefix="pidispatch-outside-"))
    folder = committed_repository(base / "copy-of-pidispatch")
    (folder / ".env").write_text("DJANGO_SECRET_KEY=not-for-the-agent\n")
    for path in [folder, *folder.rglob("*")]:
        os.lchown(path, *OWNER)
    yield folder
    shutil.rmtree(base, ignore_errors=True)


def test_an_operate_token_starts_forge_runs_but_not_folder_runs(client, repo, settings, redis_conn):
    settings.GITHUB_TOKEN = "ghp-x"
    operator = user_with("operator", START_RUN, START_FOLDER_RUN)

    folder = post_run(client, operator, "operate", {"folder": str(repo), "task": "Tidy the README"})
    forge = post_run(client, operator, "operate", {"forge": "github", "repository": "acme/web", "number": 7})

    assert folder.status_code == 403 and folder.json()["error"] == "forbidden"
    assert "admin scope" in folder.json()["detail"]
    assert forge.status_code == 202 and len(queued(redis_conn)) == 1  # the forge run only


def test_an_admin_token_needs_its_user_to_hold_the_folder_permission(client, repo, redis_conn):
    without = user_with("ops", START_RUN)
    refused = post_run(client, without, "admin", {"folder": str(repo), "task": "Tidy the README"})
    assert refused.status_code == 403 and queued(redis_conn) == []

    allowed = user_with("folder-ops", START_RUN, START_FOLDER_RUN)
    answer = post_run(client, allowed, "admin", {"folder": str(repo), "task": "Tidy the README"})
    assert answer.status_code == 202, answer.content
    assert answer.json()["target"] == "local:app" and len(queued(redis_conn)) == 1


@pytest.mark.parametrize("case", ["outside the roots", "missing outside the roots", "missing under a root",
                                  "dirty", "owned by root", "a link out of a root", "the deployment's var"])
def test_a_refused_folder_answers_one_fixed_reason_and_no_path(client, repo, outside_repo, owner_space, settings,
                                                               redis_conn, case):
    if case == "dirty":
        (repo / "wip.txt").write_text("not committed")
    elif case == "owned by root":
        os.chown(repo, 0, 0)
    elif case == "a link out of a root":
        (owner_space / "link").symlink_to(outside_repo)
    elif case == "the deployment's var":
        settings.PI_LOCAL_ROOTS = ("/",)
    folder = {"outside the roots": outside_repo, "missing outside the roots": outside_repo.parent / "nothing",
              "missing under a root": owner_space / "nothing", "dirty": repo, "owned by root": repo,
              "a link out of a root": owner_space / "link", "the deployment's var": settings.VAR_DIR}[case]
    admin = user_with("folder-ops", START_RUN, START_FOLDER_RUN)

    answer = post_run(client, admin, "admin", {"folder": str(folder), "task": "Tidy the README"})

    assert answer.status_code == 400 and answer.json() == FOLDER_NOT_ALLOWED
    assert queued(redis_conn) == []


def test_the_admin_page_takes_the_same_permission(client, repo, redis_conn):
    staff = user_with("staff", START_RUN, is_staff=True)
    client.force_login(staff)
    client.get("/admin/start-run/")

    page = client.post("/admin/start-run/", {"where": "local", "folder": str(repo), "task": "Tidy the README"})

    assert "needs the permission worker.start_folder_run" in page.content.decode() and queued(redis_conn) == []


def test_the_admin_page_says_why_without_the_hosts_path(admin_client, outside_repo, redis_conn):
    page = admin_client.post("/admin/start-run/", {"where": "local", "folder": str(outside_repo),
                                                   "task": "Tidy the README"}).content.decode()

    (said,) = re.findall(r'<ul class="errorlist[^>]*>(.*?)</ul>', page, re.S)
    assert "not under a root this host declares" in said and str(outside_repo) not in said
    assert queued(redis_conn) == []
