"""Projects and project/model scoped limits in the admin and over the API: the same rules as `import_projects` and
`import_limits` (one validators.py), canonical forms stored, and a change needs its own permission."""

import pytest
from django.contrib.auth.models import Permission, User

from apps.access import tokens
from apps.worker.models import Project, ScopedLimit

pytestmark = pytest.mark.django_db


def user_with(name: str, *permissions) -> User:
    user = User.objects.create_user(name, password="x", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="worker", codename=codename))
    return User.objects.get(pk=user.pk)


def bearer(user, scope):
    _, token = tokens.issue(user, name="test", scope=scope)
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def test_the_admin_takes_members_one_a_line_and_stores_them_canonical(admin_client):
    answer = admin_client.post("/admin/worker/project/add/", {
        "slug": "storefront", "name": "Storefront", "members": "github:acme/web\n\n  /srv/code/app/  \n"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert Project.objects.get().members == ["github:acme/web", "/srv/code/app"]
    page = admin_client.get(f"/admin/worker/project/{Project.objects.get().pk}/change/").content.decode()
    assert "github:acme/web\n/srv/code/app</textarea>" in page


@pytest.mark.parametrize("members, message", [
    ("acme/web", "name the forge, e.g. github:acme/web"),
    ("", "list at least one member"),
    ("github:acme/api", "already a member of project &#x27;ops&#x27;"),
])
def test_the_admin_refuses_a_bad_member_and_says_why(admin_client, members, message):
    Project.objects.create(slug="ops", members=["github:acme/api"])
    answer = admin_client.post("/admin/worker/project/add/", {"slug": "shop", "members": members})
    assert answer.status_code == 200 and message in answer.content.decode()
    assert Project.objects.count() == 1


def test_a_project_row_takes_its_size_in_the_admin_and_a_repository_row_does_not(admin_client):
    Project.objects.create(slug="storefront", members=["github:acme/web"])
    base = {"day": "", "week": "", "month": "", "concurrent": "", "day_usd": "", "week_usd": "", "month_usd": "",
            "cpus": "", "host_share": "", "min_jobs": "", "note": ""}
    made = admin_client.post("/admin/worker/scopedlimit/add/",
                             {**base, "scope": "project:storefront", "memory": "2048m", "cpus": "1.5"})
    assert made.status_code == 302
    assert (ScopedLimit.objects.get().memory, str(ScopedLimit.objects.get().cpus)) == ("2g", "1.50")
    refused = admin_client.post("/admin/worker/scopedlimit/add/", {**base, "scope": "acme/web", "memory": "2g"})
    assert "sizes go on project:&lt;id&gt; rows only" in refused.content.decode()


def test_the_api_reads_and_changes_projects_under_their_own_permission(client, settings):
    settings.PI_MAX_COST_USD = "1"  # a model row's dollar window needs a per-run cap
    reader = user_with("reader", "view_project")
    manager = user_with("manager", "view_project", "manage_projects", "view_scopedlimit", "manage_limits")
    assert client.post("/api/v1/projects", {"slug": "x", "members": ["/srv/x"]}, content_type="application/json",
                       **bearer(reader, "admin")).status_code == 403

    made = client.post("/api/v1/projects", {"slug": "shop", "members": ["github:acme/web", "/srv/shop/"]},
                       content_type="application/json", **bearer(manager, "admin"))
    assert made.status_code == 201, made.content
    assert made.json()["members"] == ["github:acme/web", "/srv/shop"]  # as validators.py wrote them
    assert client.get("/api/v1/projects", **bearer(reader, "read")).json()[0]["slug"] == "shop"

    bad = client.post("/api/v1/projects", {"slug": "other", "members": ["/srv/shop"]},
                      content_type="application/json", **bearer(manager, "admin"))
    assert bad.status_code == 400, bad.content
    assert "already a member of project 'shop'" in bad.json()["fields"]["members"][0], bad.json()

    limit = client.post("/api/v1/limits", {"scope": "model:Anthropic/Claude-Sonnet-4", "day_usd": "20"},
                        content_type="application/json", **bearer(manager, "admin"))
    assert limit.status_code == 201 and limit.json()["scope"] == "model:anthropic/claude-sonnet-4"
    unknown = client.post("/api/v1/limits", {"scope": "project:nowhere", "day": 1},
                          content_type="application/json", **bearer(manager, "admin"))
    assert unknown.status_code == 400 and "no project 'nowhere'" in unknown.json()["fields"]["scope"][0]


def test_a_project_a_limit_names_is_neither_deleted_nor_renamed(admin_client, client):
    project = Project.objects.create(slug="storefront", members=["github:acme/web"])
    ScopedLimit.objects.create(scope="project:storefront", day=3)

    confirm = admin_client.post(f"/admin/worker/project/{project.pk}/delete/", {"post": "yes"})
    assert "Scoped limit: project:storefront" in confirm.content.decode() and Project.objects.exists()
    renamed = admin_client.post(f"/admin/worker/project/{project.pk}/change/",
                                {"slug": "shop", "name": "", "members": "github:acme/web"})
    assert "the scoped limit project:storefront names this project" in renamed.content.decode()
    assert Project.objects.get().slug == "storefront"

    manager = user_with("manager", "view_project", "manage_projects")
    refused = client.delete(f"/api/v1/projects/{project.pk}", **bearer(manager, "admin"))
    assert refused.status_code == 400 and "project:storefront" in str(refused.json())
    assert Project.objects.exists()

    ScopedLimit.objects.all().delete()
    assert client.delete(f"/api/v1/projects/{project.pk}", **bearer(manager, "admin")).status_code == 204
